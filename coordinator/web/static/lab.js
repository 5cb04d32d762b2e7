// device-loop's web page: rows kept live from /api/v1/events (the server renders them),
// the viewer's own parts fetched again when one of their devices changed, and buttons
// that call the REST API. No polling: the only timer redraws "time left".
"use strict";

(() => {
  const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;
  const user = meta("device-loop-user");
  const csrf = meta("device-loop-csrf");
  const page = document.body.dataset.page;
  const here = document.body.dataset.device;  // on a device's page
  const rows = document.getElementById("devices");
  const notice = document.getElementById("notice");

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
  }

  // -- rows, as the event stream sends them

  function markMine(row) {  // the row is shared by every viewer: whose it is, is told here
    row.classList.toggle("mine", Boolean(user) && row.dataset.holder === user);
    return row;
  }

  function rowFrom(html) {
    const template = document.createElement("template");
    template.innerHTML = html.trim();
    return markMine(template.content.firstElementChild);
  }

  function shown(device) {
    return page === "board" || device.name === here;
  }

  function replaceAll(devices) {
    rows.replaceChildren(...devices.filter(shown).map((d) => rowFrom(d.html)));
    tick();
  }

  function replaceOne(device) {
    if (!shown(device)) return;
    const row = rowFrom(device.html);
    const old = [...rows.children].find((r) => r.dataset.name === device.name);
    if (old) old.replaceWith(row);
    else rows.insertBefore(row, [...rows.children].find((r) => r.dataset.name > device.name) || null);
    tick();
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
      } while (fetchAgain);
    })().catch((error) => say(error.message, true)).finally(() => { fetching = null; });
  }

  function concernsViewer(device) {
    if (page === "device") return device.name === here;
    const mine = [...document.querySelectorAll("#mine [data-device]")].map((s) => s.dataset.device);
    return Boolean(user) && (device.holder === user || mine.includes(device.name));
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
      if (concernsViewer(device)) refreshParts();
    });
    events.addEventListener("error", () => live.classList.remove("on"));
    [...rows.children].forEach(markMine);
  }

  // -- buttons

  const ttl = () => Number(document.getElementById("ttl").value);
  const leaseOf = (button) => button.closest("[data-lease]").dataset.lease;

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
      const lease = await call("POST", "/api/v1/leases", {device: button.closest("tr").dataset.name, ttl_s: ttl()});
      say(`${lease.device} is yours until ${new Date(lease.expires_at).toLocaleString()}: ${lease.reason}`);
      refreshParts();
    },
    async renew(button) {
      const lease = await call("POST", `/api/v1/leases/${leaseOf(button)}/renew`, {ttl_s: ttl()});
      say(`${lease.device}: renewed until ${new Date(lease.expires_at).toLocaleString()}`);
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

  tick();
  setInterval(tick, 1000);
})();
