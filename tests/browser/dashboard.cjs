// The dashboard in a real browser: headless Chromium (Debian's package)
// driven by playwright-core over the DevTools protocol. Run by the e2e test
// `dashboard` (tests/e2e/dashboard.rs), which starts the host, the tenants
// and the jobs and passes them in the environment:
//
//   SLUICE_URL          the host, http://127.0.0.1:PORT
//   SLUICE_PLAYWRIGHT   the playwright-core package directory
//   SLUICE_CHROMIUM     the browser (default /usr/bin/chromium)
//   SLUICE_SHOTS        where screenshots go (one directory per run)
//   ADMIN_TOKEN, TENANT, TENANT_TOKEN, OTHER_TOKEN
//   GOOD_JOB            running-count, fed while this runs
//   BAD_JOB             a probe whose input asks it to fail
//   BAD_TOPIC           the bad job's input topic
//
// Each check waits for what a person would see, then asserts on the text of
// the page; any failure exits non-zero with what was expected and what the
// page showed. Errors in the page (a script error, a blocked resource, a
// violation of the Content-Security-Policy) fail the run too.
"use strict";

const path = require("path");
const { chromium } = require(process.env.SLUICE_PLAYWRIGHT);

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const URL = env("SLUICE_URL");
const SHOTS = env("SLUICE_SHOTS");
const TENANT = env("TENANT");
const GOOD = env("GOOD_JOB");
const BAD = env("BAD_JOB");
const BAD_TOPIC = env("BAD_TOPIC");
const WAIT = 60_000;

function check(condition, message) {
  if (!condition) throw new Error("check failed: " + message);
}

/** A page in a fresh context (its own sessionStorage), with its errors collected. */
async function open(browser, errors) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.on("pageerror", (e) => errors.push("page error: " + e.message));
  page.on("console", (m) => {
    // Refused requests are expected where a test asks for what it may not
    // see (the browser and htmx both log them); anything else is an error.
    const refused = /status of 40[134]|Response Status Error Code 40[134]/;
    if (m.type() === "error" && !refused.test(m.text())) errors.push("console: " + m.text());
  });
  page.on("dialog", (dialog) => dialog.accept());
  return page;
}

async function signIn(page, token, at = "/") {
  await page.goto(URL + at);
  await page.waitForSelector("#sign-in:not([hidden])");
  await page.fill("#token", token);
  await page.click("#sign-in button[type=submit]");
  await page.waitForSelector("#main:not([hidden])", { timeout: WAIT });
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(SHOTS, name + ".png"), fullPage: true });
}

/** The number in `selector`'s data-value, once it is there. */
async function value(page, selector) {
  await page.waitForSelector(selector + "[data-value]", { timeout: WAIT });
  return Number(await page.getAttribute(selector, "data-value"));
}

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.SLUICE_CHROMIUM || "/usr/bin/chromium",
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  const errors = [];
  try {
    // A wrong token is refused on the sign-in form.
    const tenant = await open(browser, errors);
    await tenant.goto(URL + "/");
    await tenant.waitForSelector("#sign-in:not([hidden])");
    await tenant.fill("#token", "not-a-token");
    await tenant.click("#sign-in button[type=submit]");
    await tenant.waitForSelector("#sign-in-error:not([hidden])", { timeout: WAIT });
    check(await tenant.isHidden("#main"), "nothing is shown to a refused token");

    // The tenant's jobs list: both jobs, the failed one with its reason.
    await signIn(tenant, env("TENANT_TOKEN"));
    check((await tenant.textContent("#who")).includes(TENANT), "the header names the tenant");
    await tenant.waitForSelector(`tr[data-job="${GOOD}"]`, { timeout: WAIT });
    await tenant.waitForFunction(
      (bad) => {
        const reason = document.querySelector(`tr[data-job="${bad}"] .reason`);
        return reason && reason.textContent.includes("asked to fail");
      },
      BAD,
      { timeout: WAIT },
    );
    await tenant.waitForFunction(
      (good) => Number(document.querySelector(`tr[data-job="${good}"] .records-in`)?.dataset.value) > 0,
      GOOD,
      { timeout: WAIT },
    );
    await shot(tenant, "jobs");

    // The tally of every job, and the list narrowed by state and by search.
    await tenant.waitForFunction(() => /2 jobs: .*1 failed or restarting/.test(document.querySelector("#tally")?.textContent), null, {
      timeout: WAIT,
    });
    const rows = () => tenant.$$eval("tr[data-job]", (trs) => trs.map((tr) => tr.dataset.job).join(","));
    await tenant.selectOption("#jobs-state", "trouble");
    await tenant.waitForFunction((bad) => [...document.querySelectorAll("tr[data-job]")].map((tr) => tr.dataset.job).join(",") === bad, BAD, {
      timeout: WAIT,
    });
    check((await tenant.textContent("#showing")).includes("1 matching"), "the pager says how many match");
    await tenant.selectOption("#jobs-state", "");
    await tenant.fill("#jobs-search", GOOD.toUpperCase());
    await tenant.waitForFunction((good) => [...document.querySelectorAll("tr[data-job]")].map((tr) => tr.dataset.job).join(",") === good, GOOD, {
      timeout: WAIT,
    });
    await tenant.fill("#jobs-search", "no job is called this");
    await tenant.waitForSelector("#no-match", { timeout: WAIT });
    await tenant.fill("#jobs-search", "");
    await tenant.waitForFunction(() => document.querySelectorAll("tr[data-job]").length === 2, null, { timeout: WAIT });
    check((await rows()).split(",").sort().join(",") === [GOOD, BAD].sort().join(","), "both jobs are back");

    // The running job's page: its figures rise while it runs, without a reload.
    await tenant.click(`tr[data-job="${GOOD}"] a`);
    await tenant.waitForURL(`**/jobs/${TENANT}/${GOOD}`);
    const first = await value(tenant, "#records-in");
    await tenant.waitForFunction(
      (before) => Number(document.querySelector("#records-in")?.dataset.value) > before,
      first,
      { timeout: WAIT },
    );
    const later = await value(tenant, "#records-in");
    check(later > first, `records in rose: ${first} -> ${later}`);
    await tenant.waitForSelector("#checkpoints tbody tr", { timeout: WAIT });
    await tenant.waitForSelector("#tasks tbody tr", { timeout: WAIT });
    await tenant.waitForSelector("#partitions tbody tr", { timeout: WAIT });
    check((await tenant.textContent("#partitions")).includes(`${TENANT}.in`), "the lag of the input partition is shown");
    await tenant.waitForFunction(() => Number(document.querySelector("#chart")?.dataset.points) >= 3, null, {
      timeout: WAIT,
    });
    check(await tenant.isVisible("#chart canvas"), "the throughput chart is drawn");
    check((await tenant.textContent("#language")).trim() === "Rust", "the module's language is shown");
    const world = await tenant.textContent("#world");
    check(["transform", "upgradable", "timed", "packed", "cached", "packed-out"].includes(world.trim()), `the module's world is shown: ${world}`);
    await shot(tenant, "job");

    // Stop, confirmed, followed to its end; then resume.
    await tenant.waitForSelector("#stop");
    await tenant.click("#stop");
    await tenant.waitForFunction(() => /stop.*: done\./.test(document.querySelector("#operation")?.textContent), null, {
      timeout: WAIT,
    });
    await tenant.waitForSelector("#summary .state-stopped", { timeout: WAIT });
    await tenant.click("#resume");
    await tenant.waitForFunction(() => /Resumed/.test(document.querySelector("#operation")?.textContent), null, {
      timeout: WAIT,
    });
    await tenant.waitForSelector("#summary .state-running", { timeout: WAIT });

    // The failed job's page: the reason, the record that caused it, the log.
    await tenant.goto(`${URL}/jobs/${TENANT}/${BAD}`);
    await tenant.waitForFunction(() => document.querySelector("#reason")?.textContent.includes("asked to fail"), null, {
      timeout: WAIT,
    });
    await tenant.waitForFunction(
      (topic) => document.querySelector("#failures")?.textContent.includes(`${topic}/0@0`),
      BAD_TOPIC,
      { timeout: WAIT },
    );
    await tenant.waitForFunction(
      () => [...document.querySelectorAll("#log .line")].some((l) => l.textContent.includes("asked to fail")),
      null,
      { timeout: WAIT },
    );
    await tenant.selectOption("#log-level", "error");
    const shown = await tenant.$$eval("#log .line:not([hidden])", (rows) => rows.map((r) => r.dataset.level));
    check(shown.length > 0 && shown.every((level) => level === "error"), `only errors shown: ${shown}`);
    await tenant.fill("#log-search", "no line says this");
    check((await tenant.$$("#log .line:not([hidden])")).length === 0, "the search hides what does not match");
    await tenant.fill("#log-search", "");
    await tenant.selectOption("#log-level", "trace");
    await shot(tenant, "job-failed");

    // The tenant's use of its policy.
    await tenant.click("#nav-tenant");
    await tenant.waitForSelector("#usage tbody tr", { timeout: WAIT });
    check((await tenant.textContent("#usage")).includes("Jobs"), "the usage table lists jobs");
    check((await tenant.textContent("#modules")).includes("running-count"), "the tenant's modules are listed");
    await shot(tenant, "tenant");

    // Another tenant: no jobs of the first, not even by URL.
    const other = await open(browser, errors);
    await signIn(other, env("OTHER_TOKEN"));
    await other.waitForFunction(() => document.querySelector("#jobs")?.textContent.includes("No jobs yet"), null, {
      timeout: WAIT,
    });
    await other.goto(`${URL}/jobs/${TENANT}/${GOOD}`);
    await other.waitForFunction(() => document.querySelector("#summary .error")?.textContent.includes("no job"), null, {
      timeout: WAIT,
    });
    await other.waitForFunction(() => document.querySelector("#history .error"), null, { timeout: WAIT });
    check((await other.$$("#records-in")).length === 0, "no figure of the other tenant's job is shown");
    check((await other.$$("#log .line")).length === 0, "no log line of the other tenant's job is shown");
    await shot(other, "other-tenant");

    // The admin: every tenant, the host's figures, and no controls.
    const admin = await open(browser, errors);
    await signIn(admin, env("ADMIN_TOKEN"), "/admin");
    await admin.waitForFunction((t) => document.querySelector("#tenants")?.textContent.includes(t), TENANT, {
      timeout: WAIT,
    });
    check((await admin.textContent("#host")).includes("pool slots"), "the host's figures are shown");
    await shot(admin, "admin");
    await admin.click("header a.brand");
    await admin.waitForSelector(`tr[data-job="${GOOD}"][data-tenant="${TENANT}"]`, { timeout: WAIT });
    await admin.goto(`${URL}/jobs/${TENANT}/${GOOD}`);
    await admin.waitForFunction(() => document.querySelector("#controls")?.textContent.includes("Read-only"), null, {
      timeout: WAIT,
    });

    // Signing out forgets the token.
    await admin.click("#sign-out");
    await admin.waitForSelector("#sign-in:not([hidden])");
    check((await admin.evaluate(() => sessionStorage.getItem("sluice.token"))) === null, "the token is gone");
    await admin.waitForTimeout(1500); // a poll or two, which must not bring anything back
    check(
      await admin.evaluate(() => document.querySelector("#summary").childElementCount === 0 && !document.querySelector("#log .line")),
      "nothing of the job stays in the page after sign-out",
    );

    check(errors.length === 0, "no errors in the pages:\n" + errors.join("\n"));
    console.log("dashboard: every check passed; screenshots in " + SHOTS);
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
