// How long the dashboard takes in a real browser (headless Chromium) to
// show the jobs list and one job's page, for the density benchmark
// (host/benches/density.rs --browser). Not a test: it prints figures.
//
//   SLUICE_URL, SLUICE_PLAYWRIGHT, SLUICE_CHROMIUM (as for dashboard.cjs)
//   TENANT, TENANT_TOKEN, JOBS (how many jobs the tenant has), JOB
//
// Prints one JSON line: milliseconds from navigation to the list showing
// its first page (50 rows, or every job when fewer) and the tally of all
// of them, from a click on "Next" to the second page, from the first byte
// of the job page to its summary, history and chart filled, and the JS heap
// after a minute of the list polling.
"use strict";

const { chromium } = require(process.env.SLUICE_PLAYWRIGHT);

async function main() {
  const url = process.env.SLUICE_URL;
  const jobs = Number(process.env.JOBS);
  const rows = Math.min(jobs, 50);
  const browser = await chromium.launch({
    executablePath: process.env.SLUICE_CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
  });
  try {
    const page = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
    // Signed in before the timed loads: the token is in sessionStorage.
    await page.goto(url + "/");
    await page.evaluate((t) => sessionStorage.setItem("sluice.token", t), process.env.TENANT_TOKEN);

    const timeList = async () => {
      const started = Date.now();
      await page.goto(url + "/");
      await page.waitForFunction(
        ([n, total]) =>
          document.querySelectorAll("tr[data-job]").length === n &&
          document.querySelector("#tally")?.textContent.startsWith(total + " jobs"),
        [rows, String(jobs)],
        { timeout: 60_000, polling: 10 },
      );
      return Date.now() - started;
    };
    const list = [];
    for (let i = 0; i < 5; i++) list.push(await timeList());

    // The next page, from the click to its rows.
    const next = [];
    if (jobs > rows) {
      for (let i = 0; i < 5; i++) {
        await timeList();
        const first = await page.getAttribute("tr[data-job]", "data-job");
        const started = Date.now();
        await page.click("nav.pager button:has-text('Next')");
        await page.waitForFunction(
          (before) => {
            const row = document.querySelector("tr[data-job]");
            return row && row.dataset.job !== before && /page 2 of/.test(document.querySelector("#showing")?.textContent);
          },
          first,
          { timeout: 60_000, polling: 10 },
        );
        next.push(Date.now() - started);
      }
    }

    const timeJob = async () => {
      await page.goto(`${url}/jobs/${process.env.TENANT}/${process.env.JOB}`, { waitUntil: "commit" });
      const started = Date.now();
      await page.waitForFunction(
        () =>
          document.querySelector("#records-in") &&
          document.querySelector("#history .panel") &&
          Number(document.querySelector("#chart")?.dataset.points) >= 0 &&
          document.querySelector("#chart canvas"),
        null,
        { timeout: 60_000, polling: 5 },
      );
      return Date.now() - started;
    };
    const job = [];
    for (let i = 0; i < 5; i++) job.push(await timeJob());

    // A minute on the list, polling every second: the page's heap after it.
    await page.goto(url + "/");
    await page.waitForFunction((n) => document.querySelectorAll("tr[data-job]").length === n, rows);
    const heap = async () => (await page.evaluate(() => performance.memory && performance.memory.usedJSHeapSize)) || 0;
    const heapBefore = await heap();
    await page.waitForTimeout(60_000);
    const heapAfter = await heap();

    const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    console.log(
      JSON.stringify({
        list_ms: median(list),
        list_all_ms: list,
        next_page_ms: next.length ? median(next) : null,
        next_page_all_ms: next,
        job_after_first_byte_ms: median(job),
        job_all_ms: job,
        heap_before_bytes: heapBefore,
        heap_after_minute_bytes: heapAfter,
      }),
    );
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
