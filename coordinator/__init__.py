"""The coordinator: leases, devices, hosts and the audit log behind one Starlette app."""
