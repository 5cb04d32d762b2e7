"""``steps``: a bench that serves no lease and runs operations of kinds other than flash,
each doing what its name says, for the executor's tests. Each call of ``devloop_operate``
is noted in ``STATE_DIR/steps-begun`` (one line: the operation's id)."""
import dataclasses
import time

from device_loop.plugin import OperationError, OperationKind, hookimpl

KINDS = [
    OperationKind("count", "count to `to`, a step each `step_s` seconds", args={"to": "steps", "step_s": "seconds"},
                  exclusive=False),
    OperationKind("fail", "fail, having touched the device if `changed`", args={"changed": "true or false"},
                  exclusive=False, destructive=True),
    OperationKind("crash", "raise what no plugin should", exclusive=False),
    OperationKind("answer", "return what `give` names", args={"give": "what to return"}, exclusive=False),
]
ANSWERS = {
    "sentence": lambda: "said in a sentence",
    "dict": lambda: {"lines": 3, "log": "a\nb\nc", "message": "read 3 lines"},
    "big": lambda: {"log": "x" * (100 << 10)},
    "bad-key": lambda: {"Not A Key": 1},
    "number": lambda: 42,
}


class Steps:
    @hookimpl
    def devloop_discover(self, host):
        return [dataclasses.replace(e.resource("bench", f"steps:{e.device}"), serves_lease=False)
                for e in host.entries]

    @hookimpl
    def devloop_operations(self, host, resource):
        return KINDS

    @hookimpl
    def devloop_operate(self, host, resource, op):
        with open(host.state_dir / "steps-begun", "a") as begun:
            begun.write(op.id + "\n")
        if op.kind == "count":
            to, step_s = int(op.args.get("to", 3)), float(op.args.get("step_s", 0.0))
            for step in range(1, to + 1):
                time.sleep(step_s)
                op.progress("counting", step, to, "steps")
            return {"counted": to, "by": op.requester, "message": f"counted to {to}"}
        if op.kind == "fail":
            raise OperationError("the bench did not answer", changed=bool(op.args.get("changed", True)))
        if op.kind == "crash":
            raise RuntimeError("a bug in the plugin")
        op.progress("Not A Word!", 1, 2, "a unit much too long for a report")
        return ANSWERS[op.args["give"]]()
