// The dashboard's behaviour: sign-in, the token on every request, the
// throughput chart and the log. The host renders everything else (htmx
// swaps its fragments in); this file builds DOM only with textContent, and
// sets no inline style, so the page's Content-Security-Policy of 'self'
// holds.
(function () {
  "use strict";

  const TOKEN = "sluice.token";
  /** What getJson throws for an answer to a token signed out meanwhile. */
  const STALE = "stale";
  const LOG_ROWS = 2000;
  const LEVELS = { trace: 0, debug: 1, info: 2, warn: 3, error: 4 };

  const $ = (id) => document.getElementById(id);
  const token = () => sessionStorage.getItem(TOKEN);

  /**
   * A GET with the token, answering the parsed JSON or throwing. An answer
   * that arrives after its token was signed out is dropped (it throws), as
   * htmx's are: a poll in flight at sign-out must not bring anything back.
   */
  async function getJson(url) {
    const sent = token();
    const response = await fetch(url, {
      headers: { Authorization: "Bearer " + sent },
      cache: "no-store",
    });
    if (token() !== sent) throw new Error(STALE);
    if (response.status === 401) {
      signOut("The token was refused; sign in again.");
      throw new Error("unauthorized");
    }
    if (!response.ok) throw new Error(await errorText(response.status, await response.text()));
    const body = await response.json();
    if (token() !== sent) throw new Error(STALE);
    return body;
  }

  /** The API's `{"error": ...}` message, or the status. */
  async function errorText(status, body) {
    try {
      const parsed = JSON.parse(body);
      if (parsed && typeof parsed.error === "string") return parsed.error;
    } catch (_) {
      // not JSON: fall through
    }
    return "The host answered " + status + ".";
  }

  function show(element, visible) {
    if (element) element.hidden = !visible;
  }

  function banner(text) {
    const element = $("banner");
    element.textContent = text || "";
    show(element, Boolean(text));
  }

  function signOut(reason) {
    sessionStorage.removeItem(TOKEN);
    stopLive();
    // Nothing the last token could see stays in the page.
    document.querySelectorAll("#main [hx-get], #operation").forEach((region) => region.replaceChildren());
    show($("main"), false);
    show($("nav"), false);
    show($("sign-out"), false);
    $("who").textContent = "";
    show($("sign-in"), true);
    const error = $("sign-in-error");
    error.textContent = reason || "";
    show(error, Boolean(reason));
    $("token").focus();
  }

  /** Asks who the token belongs to, then shows the page for that role. */
  async function start() {
    let session;
    try {
      session = await getJson("/ui/session");
    } catch (e) {
      // A refused token signed out already; a stale answer belongs to a
      // token no longer in use.
      if (e.message !== "unauthorized" && e.message !== STALE) signOut(e.message);
      return;
    }
    show($("sign-in"), false);
    show($("sign-in-error"), false);
    show($("nav"), true);
    show($("nav-tenant"), session.role === "tenant");
    show($("nav-admin"), session.role === "admin");
    show($("sign-out"), true);
    $("who").textContent = session.role === "admin" ? "admin" : "tenant " + session.tenant;
    show($("main"), true);
    document.querySelectorAll("[hx-get]").forEach((element) => htmx.trigger(element, "refresh"));
    startLive();
  }

  // Every htmx request carries the token; none leaves without one.
  document.addEventListener("htmx:configRequest", (event) => {
    const current = token();
    if (!current) {
      event.preventDefault();
      return;
    }
    event.detail.headers["Authorization"] = "Bearer " + current;
  });

  // An answer that arrives after sign-out is dropped, not shown.
  document.addEventListener("htmx:beforeSwap", (event) => {
    if (!token()) event.detail.shouldSwap = false;
  });

  // A refused token signs out; any other error replaces the region with
  // the host's message (a job of another tenant reads as not found).
  document.addEventListener("htmx:responseError", async (event) => {
    const xhr = event.detail.xhr;
    if (xhr.status === 401) {
      signOut("The token was refused; sign in again.");
      return;
    }
    const target = event.detail.target;
    if (!target) return;
    const message = document.createElement("p");
    message.className = "error";
    message.textContent = await errorText(xhr.status, xhr.responseText);
    target.replaceChildren(message);
  });

  document.addEventListener("htmx:sendError", () => banner("The host is not answering; retrying."));
  document.addEventListener("htmx:afterRequest", (event) => {
    if (event.detail.successful) banner("");
  });

  // ---- the throughput chart ----------------------------------------------

  let chart = null;
  let timers = [];

  /** Seconds since the epoch of each point of a `Rates`. */
  function times(rates) {
    const n = rates.records_in.length;
    return rates.records_in.map((_, i) => rates.end - (n - 1 - i));
  }

  function startChart(element) {
    const width = () => Math.max(320, element.clientWidth);
    const data = [[], [], []];
    chart = new uPlot(
      {
        width: width(),
        height: 220,
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: true } },
        axes: [{}, { size: 60, values: (_, ticks) => ticks.map(short) }],
        series: [
          {},
          { label: "in/s", stroke: "#2563eb", width: 1.5 },
          { label: "out/s", stroke: "#16a34a", width: 1.5 },
        ],
      },
      data,
      element,
    );
    window.addEventListener("resize", () => chart && chart.setSize({ width: width(), height: 220 }));
    let end = 0;
    const poll = async () => {
      // The whole hour once, then only the seconds since the last read.
      const seconds = end === 0 ? "" : "?seconds=" + Math.min(3600, Math.max(2, Math.floor(Date.now() / 1000) - end + 2));
      let rates;
      try {
        rates = await getJson(element.dataset.src + seconds);
      } catch (_) {
        return;
      }
      const at = times(rates);
      for (let i = 0; i < at.length; i++) {
        if (at[i] <= end) continue;
        data[0].push(at[i]);
        data[1].push(rates.records_in[i]);
        data[2].push(rates.records_out[i]);
      }
      if (rates.end > end) end = rates.end;
      const horizon = end - 3600;
      while (data[0].length && data[0][0] <= horizon) {
        data[0].shift();
        data[1].shift();
        data[2].shift();
      }
      chart.setData(data);
      element.dataset.points = String(data[0].length);
    };
    poll();
    timers.push(setInterval(poll, 1000));
  }

  function short(n) {
    if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
    if (n >= 1e3) return (n / 1e3).toFixed(1) + "k";
    return String(n);
  }

  // ---- the log -----------------------------------------------------------

  function startLog(element) {
    let after = 0;
    const level = $("log-level");
    const search = $("log-search");
    const follow = $("log-follow");

    const visible = (row) =>
      LEVELS[row.dataset.level] >= LEVELS[level.value] &&
      (search.value === "" || row.dataset.text.includes(search.value.toLowerCase()));
    const filter = () => element.querySelectorAll(".line").forEach((row) => (row.hidden = !visible(row)));
    level.addEventListener("change", filter);
    search.addEventListener("input", filter);

    const poll = async () => {
      if (!follow.checked) return;
      let lines;
      try {
        lines = await getJson(element.dataset.src + "?after=" + after);
      } catch (_) {
        return;
      }
      if (lines.length === 0) return;
      const stick = element.scrollTop + element.clientHeight >= element.scrollHeight - 4;
      for (const line of lines) {
        after = Math.max(after, line.seq);
        element.append(logRow(line, visible));
      }
      while (element.childElementCount > LOG_ROWS) element.firstElementChild.remove();
      if (stick) element.scrollTop = element.scrollHeight;
    };
    poll();
    timers.push(setInterval(poll, 1000));
  }

  function logRow(line, visible) {
    const row = document.createElement("div");
    row.className = "line level-" + line.level;
    row.dataset.level = line.level in LEVELS ? line.level : "info";
    row.dataset.text = (line.level + " " + line.source + " " + line.message).toLowerCase();
    const cell = (className, text) => {
      const span = document.createElement("span");
      span.className = className;
      span.textContent = text;
      row.append(span);
    };
    cell("time", new Date(line.time_ms).toISOString().substring(11, 23));
    cell("level", line.level);
    cell("task", "task " + line.task + " " + line.source);
    cell("message", line.message);
    row.hidden = !visible(row);
    return row;
  }

  function startLive() {
    stopLive();
    const element = $("chart");
    if (element) startChart(element);
    const log = $("log");
    if (log) startLog(log);
  }

  function stopLive() {
    timers.forEach(clearInterval);
    timers = [];
    if (chart) {
      chart.destroy();
      chart = null;
    }
    const log = $("log");
    if (log) log.replaceChildren();
  }

  // ---- the jobs list's search, filter and pages ---------------------------

  // The list polls with the values of #jobs-query (hx-include); a change to
  // the search or the filter starts again at the first page, and a pager
  // button moves to its page. A request made while a poll is in flight
  // waits for it (hx-sync "queue last") and reads the form when it is sent,
  // so no request is aborted and the newest query is the one shown. A page
  // past the end is answered with the last one, and the pager's buttons
  // count from the page shown.
  function wireJobsList() {
    const query = $("jobs-query");
    const list = $("jobs");
    if (!query || !list) return;
    const pageField = $("jobs-page");
    const reload = () => htmx.trigger(list, "refresh");
    query.addEventListener("submit", (event) => {
      event.preventDefault();
      reload();
    });
    query.addEventListener("input", () => {
      pageField.value = "0";
      reload();
    });
    list.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-page]");
      if (!button || button.disabled) return;
      pageField.value = button.dataset.page;
      reload();
    });
  }

  // ---- wiring ------------------------------------------------------------

  wireJobsList();

  $("sign-in").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN, value);
    $("token").value = "";
    start();
  });
  $("sign-out").addEventListener("click", () => signOut(""));

  if (token()) start();
  else signOut("");
})();
