// Drives the web console in headless Chromium (Playwright), as a user
// would: list streams, open one, see an event arrive live, resume a halted
// subscription and see the held event delivered. Run by tests/e2e/console.rs:
//   node drive.mjs '{"url": ..., "project": ..., "stream": ..., "subscription": ..., "shots": dir}'
// Exits non-zero (with the reason) when a step does not happen in time.
import { chromium } from "playwright-core";

const args = JSON.parse(process.argv[2]);
const { url, project, stream, subscription, shots, token } = args;
const step = (what) => console.error(`console: ${what}`);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.setDefaultTimeout(20000);
  const problems = [];
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  // 4xx answers are the API's to give (a processor with no instance yet is
  // a 404 the page shows); script errors and 5xx are problems.
  page.on("console", (m) => {
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push(`console error: ${m.text()}`);
  });
  page.on("response", (r) => { if (r.status() >= 500) problems.push(`${r.status()} from ${r.url()}`); });
  await page.addInitScript(([p, t]) => {
    localStorage.setItem("streamhost.project", p);
    localStorage.setItem("streamhost.token", t ?? "");
  }, [project, token]);

  step("load the streams view");
  await page.goto(`${url}/console#/streams`);
  const link = page.getByRole("link", { name: stream, exact: true });
  await link.waitFor();
  if (shots) await page.screenshot({ path: `${shots}/console-streams.png` });

  step(`open ${stream}`);
  await link.click();
  await page.locator(`[data-testid=events] tr[data-offset]`).first().waitFor();
  await page.locator(`[data-testid=halt-${subscription}]`, { hasText: "halted" }).waitFor();

  step("see an event arrive live");
  const appended = await fetch(`${url}/v1/projects/${project}/streams${stream}:append`, {
    method: "POST",
    headers: Object.assign({ "content-type": "application/json" }, token ? { authorization: `Bearer ${token}` } : {}),
    body: JSON.stringify({ events: [{ type: "events.example/live", payload: { seen: "live" } }] }),
  }).then((r) => r.json());
  const offset = appended.events[0].offset;
  await page.locator(`[data-testid=events] tr[data-offset="${offset}"]`, { hasText: "events.example/live" }).waitFor();
  if (shots) await page.screenshot({ path: `${shots}/console-stream.png`, fullPage: true });

  step(`resume ${subscription}`);
  await page.locator(`[data-testid=resume-${subscription}]`).click();
  await page.locator(`[data-testid=halt-${subscription}]`, { hasText: "delivering" }).waitFor();
  // Its cursor moves past the held events and the live one.
  await page.waitForFunction(([key, at]) => {
    const cell = document.querySelector(`[data-testid=cursor-${key}]`);
    return cell && Number(cell.textContent) >= at;
  }, [subscription, offset]);

  step("see a processor's keyed state");
  await page.locator(`[data-testid=keys-ledger] tr`, { hasText: "balance/acct-1" }).waitFor();

  step("verify the processor");
  await page.locator("button", { hasText: "Verify" }).first().click();
  await page.locator(`[data-testid^=verify-]`, { hasText: "state = fold(log)" }).waitFor();

  step("the components and effects views");
  await page.goto(`${url}/console#/components`);
  await page.locator(`[data-testid=components] tr`).first().waitFor();
  if (shots) await page.screenshot({ path: `${shots}/console-components.png` });
  await page.goto(`${url}/console#/effects`);
  await page.locator(`[data-testid=all-effects] tr`).first().waitFor();
  if (shots) await page.screenshot({ path: `${shots}/console-effects.png` });

  if (problems.length) throw new Error(problems.join("\n"));
  step("done");
} finally {
  await browser.close();
}
