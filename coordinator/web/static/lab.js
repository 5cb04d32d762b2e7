// device-loop's web page: rows and the queue kept live from /api/v1/events (the server
// renders them), the viewer's own parts fetched again when one of their devices or their
// place in the queue changed, and buttons that call the REST API. No polling: the only
// timer redraws "time left", and the only long-polls follow a settle or a power operation
// the viewer sees run.
// Text from the API goes into the page as text (textContent), never as HTML: the only HTML
// inserted is what the server rendered from its templates, which escape.
"use strict";

(() => {
  const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;
  const user = meta("device-loop-user");
  const csrf = meta("device-loop-csrf");
  const page = document.body.dataset.page;
  const here = document.body.dataset.device;  // on a device's page
  const rows = document.getElementById("devices");
  const waiting = document.getElementById("waiting");  // the queue's rows
  const notice = document.getElementById("notice");
  const FOLLOW_S = 5;  // a settle's progress changes with no change of state, which no long-poll answers

  let hiding = null;

  function say(text, bad = false) {
    notice.textContent = text;
    notice.hidden = !text;
    notice.classList.toggle("error", bad);
    clearTimeout(hiding);
    if (!bad) hiding = setTimeout(() => { notice.hidden = true; }, 8000);  // news, not a state: it fades
  }

  async function call(method, path, body) {
    const answer = await fetch(path, {
      method, credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-Device-Loop-CSRF": csrf},
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const json = (answer.headers.get("content-type") || "").includes("json") ? await answer.json() : null;
    if (!answer.ok) throw new Error(json && json.message ? json.message : `${method} ${path}: ${answer.status}`);
    return json;
  }

  // -- time left and "since", redrawn each second (a display timer: nothing is fetched)

  function duration(seconds) {  // as the CLI prints them: 45s, 12m, 3h05m, 2d04h
    const s = Math.max(0, Math.floor(seconds));
    const two = (n) => String(n).padStart(2, "0");
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m`;
    if (s < 86400) { const m = Math.floor(s / 60) % 60; return `${Math.floor(s / 3600)}h${m ? two(m) + "m" : ""}`; }
    const h = Math.floor(s / 3600) % 24;
    return `${Math.floor(s / 86400)}d${h ? two(h) + "h" : ""}`;
  }

  function tick() {
    const now = Date.now();
    for (const t of document.querySelectorAll("time[data-left]")) {
      t.textContent = `${duration((Date.parse(t.dateTime) - now) / 1000)} left`;
    }
    for (const t of document.querySelectorAll("time[data-ago]")) {
      t.textContent = `${duration((now - Date.parse(t.dateTime)) / 1000)} ago`;
    }
    for (const t of document.querySelectorAll("time[data-waited]")) {  // seconds waited when it was sent
      t.dateTime = new Date(now - Number(t.dataset.waited) * 1000).toISOString();
      delete t.dataset.waited;
      t.dataset.for = "";
    }
    for (const t of document.querySelectorAll("time[data-for]")) {
      t.textContent = duration((now - Date.parse(t.dateTime)) / 1000);
    }
  }

  // -- rows, as the event stream sends them

  const known = new Map();  // device name -> the device, as the stream last sent it
  let queue = [];           // the waiting tickets, as the stream last sent them (no ids)

  const REAL_HW = ["hardware", "simulated"], VIRTUAL = ["virtual", "emulated"];  // (core/needs.py)
  function meets(device, want) {  // a fidelity its needs take (a fallback counted)
    if (!want.needs) return true;
    if (want.needs === "real-hw") return REAL_HW.includes(device.fidelity);
    return VIRTUAL.includes(device.fidelity) || (Boolean(want.fallback) && REAL_HW.includes(device.fidelity));
  }

  function serves(device, want) {  // is it what the ticket waits for? (as pages.py: serves)
    if (!meets(device, want)) return false;
    if (want.device) return want.device === device.name;
    return (!want.device_class || want.device_class === device.class) &&
      want.tags.every((tag) => device.tags.includes(tag));
  }

  function markMine(row) {  // the row is shared by every viewer: whose it is, is told here
    row.classList.toggle("mine", Boolean(user) && row.dataset.holder === user);
    const device = known.get(row.dataset.name);
    const cell = row.querySelector('td[data-label="State"]');
    if (device && cell) {  // how many tickets wait for it (by name, or for its class and tags)
      const tickets = queue.filter((e) => serves(device, e));
      let mark = cell.querySelector(".queued");
      if (!tickets.length) {
        if (mark) mark.remove();
      } else {
        if (!mark) {
          mark = document.createElement("span");
          mark.className = "mark queued";
          cell.append(" ", mark);
        }
        mark.textContent = `${tickets.length} waiting`;
        mark.title = tickets.map((e) => `${e.position}. ${e.requester} (${e.kind}) for ${e.wants}`).join("\n");
      }
    }
    return row;
  }

  function rowFrom(html) {
    const template = document.createElement("template");
    template.innerHTML = html.trim();
    return template.content.firstElementChild;
  }

  function shown(device) {
    return page === "board" || device.name === here;
  }

  function replaceAll(devices) {
    known.clear();
    for (const d of devices) known.set(d.name, d);
    rows.replaceChildren(...devices.filter(shown).map((d) => markMine(rowFrom(d.html))));
    tick();
  }

  function replaceOne(device) {
    known.set(device.name, device);
    if (!shown(device)) return;
    const row = markMine(rowFrom(device.html));
    const old = [...rows.children].find((r) => r.dataset.name === device.name);
    if (old) old.replaceWith(row);
    else rows.insertBefore(row, [...rows.children].find((r) => r.dataset.name > device.name) || null);
    tick();
  }

  // -- the queue: on the board every waiting ticket, on a device's page those it could serve

  function showQueue() {
    if (!waiting) return;
    const entries = page === "board" ? queue : queue.filter((e) => known.has(here) && serves(known.get(here), e));
    waiting.replaceChildren(...entries.map((e) => {
      const row = rowFrom(e.html);
      row.classList.toggle("mine", Boolean(user) && e.requester === user);
      return row;
    }));
    document.getElementById("queue").hidden = !entries.length;
    [...rows.children].forEach(markMine);
    tick();
  }

  let myPlaces = null;  // the viewer's places in the queue, as last seen

  function placesChanged() {
    const places = JSON.stringify(queue.filter((e) => e.requester === user).map((e) => [e.wants, e.position]));
    const changed = myPlaces !== null && places !== myPlaces;
    myPlaces = places;
    return changed;
  }

  // -- the viewer's own parts of the page (their leases; a device's details), fetched again

  let fetching = null;
  let fetchAgain = false;

  function refreshParts() {
    if (fetching) { fetchAgain = true; return; }
    fetching = (async () => {
      do {
        fetchAgain = false;
        const answer = await fetch(location.pathname, {credentials: "same-origin"});
        const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
        for (const part of document.querySelectorAll("[data-part]")) {
          const next = fresh.getElementById(part.id);
          if (next && next.innerHTML !== part.innerHTML) part.replaceWith(next);  // an unchanged camera keeps streaming
        }
        tick();
        showPower();
        followShown();
      } while (fetchAgain);
    })().catch((error) => say(error.message, true)).finally(() => { fetching = null; });
  }

  function concernsViewer(device) {
    const queued = document.querySelector("#tickets [data-ticket]");  // a grant: the device is theirs now
    if (page === "device") return device.name === here || Boolean(user && queued) && device.holder === user;
    const mine = [...document.querySelectorAll("#mine [data-device]")].map((s) => s.dataset.device);
    return Boolean(user) && (device.holder === user || mine.includes(device.name));
  }

  // -- an operation the viewer follows (a settle), its progress shown until it ends

  const LIVE_OPS = ["queued", "running"];
  const following = new Set();

  function progress(op) {
    const now = (op.progress && op.progress.detail) || "";  // where it stands while it runs; then its result
    const detail = LIVE_OPS.includes(op.state) ? now : op.message || now;
    return `${op.kind} ${op.state}${detail ? `: ${detail}` : ""}`;
  }

  async function follow(op) {  // (the page shows it as it was when rendered: from there on, here)
    if (following.has(op.id)) return;
    following.add(op.id);
    try {
      while (LIVE_OPS.includes(op.state)) {
        op = await call("GET", `/api/v1/ops/${encodeURIComponent(op.id)}?wait=${FOLLOW_S}&unless=${op.state}`);
        for (const p of document.querySelectorAll(`[data-op="${CSS.escape(op.id)}"]`)) p.textContent = progress(op);
      }
      say(`${op.device}: ${progress(op)}`, op.state !== "done");
      refreshParts();
    } catch (error) {
      say(error.message, true);
    } finally {
      following.delete(op.id);
    }
  }

  // -- a power operation (the viewer pressed a button, or the page shows one run), its
  // outcome shown in place: verified, unverified or failed, with its message and the time
  // to the console's first byte. What the result holds came from an exporter: only text.

  let powerSaid = null;  // [text, class] of the outcome shown last (a part fetched again shows it too)

  function powerOutcome(op) {
    const action = op.args && typeof op.args.action === "string" ? op.args.action : "";
    const what = action ? `power ${action}` : "power";
    const message = typeof op.message === "string" ? op.message : "";
    if (LIVE_OPS.includes(op.state)) {
      const now = (op.progress && op.progress.detail) || "";
      return [`${what} ${op.state}${now ? `: ${now}` : ""}`, "progress"];
    }
    if (op.state !== "done") return [`${what}: failed${message ? `: ${message}` : ""}`, "pv-failed"];
    const result = op.result && typeof op.result === "object" ? op.result : {};
    const verdict = result.verdict === "verified" ? "verified" : "unverified";
    const first = result.first_byte_s;
    const byte = typeof first === "number" && Number.isFinite(first) ? `; first console byte ${first.toFixed(2)} s` : "";
    return [`${what}: ${verdict}${byte}${message ? ` (${message})` : ""}`, `pv-${verdict}`];
  }

  function showPower() {
    const shown = document.getElementById("power-outcome");
    if (!shown || !powerSaid) return;
    shown.textContent = powerSaid[0];
    shown.className = `power-outcome ${powerSaid[1]}`;
    shown.hidden = false;
  }

  async function followPower(op) {
    if (following.has(op.id)) return;
    following.add(op.id);
    try {
      while (LIVE_OPS.includes(op.state)) {
        op = await call("GET", `/api/v1/ops/${encodeURIComponent(op.id)}?wait=${FOLLOW_S}&unless=${op.state}`);
        powerSaid = powerOutcome(op);
        showPower();
      }
      refreshParts();  // its row: the outcome, as the section lists it
    } catch (error) {
      say(error.message, true);
    } finally {
      following.delete(op.id);
    }
  }

  function followShown() {  // the live operations the page shows (it came with one, or a part did)
    for (const p of document.querySelectorAll("[data-op][data-op-state]")) {
      if (LIVE_OPS.includes(p.dataset.opState)) {
        follow({id: p.dataset.op, state: p.dataset.opState});
      }
    }
    for (const row of document.querySelectorAll("[data-power-op][data-op-state]")) {
      if (LIVE_OPS.includes(row.dataset.opState)) {
        followPower({id: row.dataset.powerOp, state: row.dataset.opState});
      }
    }
  }

  // -- the live feed (pages with device rows)

  if (rows) {
    const live = document.getElementById("live");
    let connected = false;
    const events = new EventSource("/api/v1/events?html=1");
    events.addEventListener("snapshot", (event) => {
      replaceAll(JSON.parse(event.data));
      if (connected) refreshParts();  // back after a break: what changed meanwhile
      connected = true;
      live.classList.add("on");
    });
    events.addEventListener("device", (event) => {
      const device = JSON.parse(event.data);
      replaceOne(device);
      if (page === "device" && device.name === here) showQueue();  // (its class or tags may have changed)
      if (concernsViewer(device)) refreshParts();
    });
    events.addEventListener("queue", (event) => {
      queue = JSON.parse(event.data);
      showQueue();
      if (user && placesChanged()) refreshParts();  // their ticket moved, or was granted: "Your tickets"
    });
    events.addEventListener("error", () => live.classList.remove("on"));
    [...rows.children].forEach(markMine);
  }

  // -- buttons

  const ttl = () => Number(document.getElementById("ttl").value);
  const leaseOf = (button) => button.closest("[data-lease]").dataset.lease;

  function reserved(answer) {  // a lease, or (with queue) a ticket
    if (answer.ticket) {
      const what = answer.device ? answer.device : `any device ${answer.wants}`;
      say(`Nothing that fits is free: you are number ${answer.position} in the queue for ${what}; ` +
          "when one is free it is held for you a little while: take it here, where this page offers it");
    } else {
      say(`${answer.device} is yours until ${answer.expires_at}`);  // (its panel says when it is ready)
    }
    refreshParts();
  }

  async function copy(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    const area = document.createElement("textarea");  // plain http to a lab name is no secure context
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }

  const actions = {
    async copy(button) {
      await copy(button.previousElementSibling.textContent);
      say("copied");
    },
    async reserve(button) {
      reserved(await call("POST", "/api/v1/leases", {device: button.closest("tr").dataset.name, ttl_s: ttl()}));
    },
    async queue(button) {
      reserved(await call("POST", "/api/v1/leases", {device: button.closest("tr").dataset.name, queue: true,
                                                      ttl_s: ttl()}));
    },
    async "reserve-any"(button) {
      const form = button.closest(".reserve-any");
      const field = (name) => form.querySelector(`[name="${name}"]`);
      const wanted = field("class").value.trim();
      const tags = field("tags").value.split(",").map((tag) => tag.trim()).filter(Boolean);  // (as the CLI's)
      const needs = field("needs").value;  // "": any device; real-hw; any (a virtual machine or an emulator)
      if (!wanted && !tags.length && !needs) {
        throw new Error("Give a class, tags, what it needs, or more: any free device that fits is yours");
      }
      const body = {tags, queue: field("queue").checked, ttl_s: ttl()};
      if (wanted) body.class = wanted;
      if (needs) body.needs = needs;
      reserved(await call("POST", "/api/v1/leases", body));
    },
    async "claim-ticket"(button) {  // a granted ticket claimed: its lease is the viewer's
      const id = button.closest("[data-ticket]").dataset.ticket;
      const ticket = await call("POST", `/api/v1/tickets/${encodeURIComponent(id)}/claim`);
      say(ticket.lease ? `${ticket.lease.device} is yours until ${ticket.lease.expires_at}` : `${ticket.ticket}: ${ticket.state}`);
      refreshParts();
    },
    async "cancel-ticket"(button) {
      const id = button.closest("[data-ticket]").dataset.ticket;
      const ticket = await call("POST", `/api/v1/tickets/${encodeURIComponent(id)}/cancel`);
      say(`${ticket.ticket}: ${ticket.state}`);
      refreshParts();
    },
    async settle(button) {
      const op = await call("POST", `/api/v1/leases/${encodeURIComponent(button.dataset.lease)}/settle`);
      say(`${op.device}: ${progress(op)}`);
      refreshParts();  // the page shows it running, and follows it
      follow(op);
    },
    async power(button) {  // the holder's lease's route, or an admin's of a device nobody holds
      const box = button.closest(".power-buttons");
      const body = {action: button.dataset.action};
      if (body.action === "cycle") {
        const off = box.querySelector('input[name="off_time_s"]').value.trim();
        if (off) {
          body.off_time_s = Number(off);
          if (!Number.isFinite(body.off_time_s)) throw new Error("The off time is seconds: a number, from 0 to 600");
        }
      }
      const path = box.dataset.powerLease
        ? `/api/v1/leases/${encodeURIComponent(box.dataset.powerLease)}/power`
        : `/api/v1/admin/devices/${encodeURIComponent(box.dataset.powerDevice)}/power`;
      const op = await call("POST", path, body);
      powerSaid = powerOutcome(op);
      showPower();
      refreshParts();  // the section lists it
      await followPower(op);
    },
    async "clear-fault"(button) {
      const name = button.dataset.device;
      await call("POST", `/api/v1/admin/devices/${encodeURIComponent(name)}/clear-fault`);
      say(`${name}: its fault is cleared`);
    },
    async "kill-orphans"(button) {
      const name = button.dataset.device;
      const op = await call("POST", `/api/v1/admin/devices/${encodeURIComponent(name)}/orphans/kill`);
      say(`${name}: its exporter kills what still holds it (${op.id})`);
    },
    async renew(button) {
      const lease = await call("POST", `/api/v1/leases/${leaseOf(button)}/renew`, {ttl_s: ttl()});
      say(`${lease.device}: renewed until ${lease.expires_at}`);
    },
    async release(button) {
      const device = button.closest("[data-lease]").dataset.device;
      if (!confirm(`Release ${device}? Its endpoints close, and anyone may reserve it then.`)) return;
      const lease = await call("POST", `/api/v1/leases/${leaseOf(button)}/release`);
      say(`${lease.device}: released`);
      refreshParts();
    },
    async logout() {
      await call("POST", "/logout");
      location.assign(location.pathname);
    },
    async retire(button) {
      const name = button.dataset.device, retired = button.dataset.retired === "true";
      if (retired && !confirm(`Retire ${name}? Nobody can reserve it until an admin returns it.`)) return;
      await call("POST", `/api/v1/admin/devices/${encodeURIComponent(name)}/retire`, {retired, force: retired});
      say(`${name}: ${retired ? "retired" : "back in the lab"}`);
    },
    async adopt(button) {
      const row = button.closest("[data-candidate]");
      const field = (name) => row.querySelector(`[name="${name}"]`).value.trim();
      const adopted = await call("POST", `/api/v1/admin/candidates/${encodeURIComponent(row.dataset.candidate)}/adopt`,
                                 {name: field("name"), class: field("class")});
      row.remove();
      say(adopted.note);
    },
    async "cancel-job"(button) {
      if (!confirm("Cancel this job? Its leases are released; the runs it has are kept.")) return;
      const job = await call("POST", `/api/v1/jobs/${encodeURIComponent(button.dataset.job)}/cancel`);
      say(`${job.id}: ${job.state}`);
      refreshParts();
    },
    async "known-good"(button) {
      const image = await call("POST", `/api/v1/admin/images/${button.dataset.image}/known-good`,
                               {for: button.dataset.for});
      say(`${image.name} is known-good for ${button.dataset.for}`);
      refreshParts();
    },
  };

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-act]");
    if (!button) return;
    button.disabled = true;
    try {
      await actions[button.dataset.act](button);
    } catch (error) {
      say(error.message, true);
    } finally {
      button.disabled = false;
    }
  });

  // -- a job's page: shown again at each change of its state, while it is queued or running

  async function followJob(id, state) {
    const live = document.getElementById("live");
    try {
      while (["queued", "running"].includes(state)) {
        live.classList.add("on");
        const job = await call("GET", `/api/v1/jobs/${encodeURIComponent(id)}?wait=25&unless=${state}`);
        if (job.state !== state) refreshParts();
        state = job.state;
      }
    } catch (error) {
      say(error.message, true);
    } finally {
      live.classList.remove("on");
    }
  }

  tick();
  followShown();
  if (page === "job") followJob(document.body.dataset.job, document.body.dataset.jobState);
  setInterval(tick, 1000);
})();
