// Drives the web console in headless Chromium (Playwright), as a user
// would: list streams, open one, see an event arrive live, resume a halted
// subscription and see the held event delivered. Run by tests/e2e/console.rs:
//   node drive.mjs '{"url": ..., "project": ..., "stream": ..., "subscription": ..., "shots": dir}'
// Exits non-zero (with the reason) when a step does not happen in time.
import { chromium } from "playwright-core";

const args = JSON.parse(process.argv[2]);
const { url, project, stream, subscription, shots, token, failing } = args;
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

  if (args.shadow) {
    // A shadow version: its diff shown, a look back in time with the
    // slider, then promoted with its button.
    const c = args.shadow;
    step(`open ${stream} with a shadow of ${c}`);
    await page.goto(`${url}/console#/stream?path=${encodeURIComponent(stream)}`);
    await page.locator(`[data-testid=shadow-${c}]`, { hasText: "ready" }).waitFor();
    await page.locator(`[data-testid=shadow-diff-${c}]`, { hasText: "/effects" }).waitFor();
    step(`the state at offset ${args.at}`);
    await page.locator(`[data-testid=at-${c}]`).fill(String(args.at));
    await page.locator(`[data-testid=at-state-${c}]`, { hasText: `state at offset ${args.at}` }).waitFor();
    await page.locator(`[data-testid=at-state-${c}]`, { hasText: args.atShows }).waitFor();
    if (shots) await page.screenshot({ path: `${shots}/console-shadow.png`, fullPage: true });
    step("promote the shadow");
    await page.locator(`[data-testid=promote-${c}]`).click();
    await page.locator(`[data-testid=digest-${c}]`, { hasText: args.digest.slice(0, 16) }).waitFor();
    await page.locator(`[data-testid=shadow-${c}]`).waitFor({ state: "detached" });
    if (problems.length) throw new Error(problems.join("\n"));
    step("done");
    await browser.close();
    process.exit(0);
  }

  if (args.parked) {
    // Parked ingest: listed with why; one redriven, one discarded.
    const [redrive, discard] = args.parked;
    step("open the parked ingest view");
    await page.goto(`${url}/console#/ingest`);
    await page.locator(`[data-testid=parked] tr[data-parked="${redrive}"]`, { hasText: args.reason }).waitFor();
    await page.locator(`[data-testid=parked] tr[data-parked="${discard}"]`).waitFor();
    if (shots) await page.screenshot({ path: `${shots}/console-ingest.png`, fullPage: true });
    step(`discard ${discard}`);
    await page.locator(`[data-testid=discard-parked-${discard}]`).click();
    await page.locator(`[data-testid=parked] tr[data-parked="${discard}"]`).waitFor({ state: "detached" });
    step(`redrive ${redrive}`);
    await page.locator(`[data-testid=redrive-parked-${redrive}]`).click();
    await page.locator(`[data-testid=parked] tr[data-parked="${redrive}"]`).waitFor({ state: "detached" });
    await page.locator(`[data-testid=parked]`, { hasText: "nothing parked" }).waitFor();
    if (problems.length) throw new Error(problems.join("\n"));
    step("done");
    await browser.close();
    process.exit(0);
  }

  if (failing) {
    // A subscription that is failing, not halted: red in the health line
    // and its row, with a button that retries it now.
    step(`open ${stream} with ${failing} failing`);
    await page.goto(`${url}/console#/stream?path=${encodeURIComponent(stream)}`);
    await page.locator(`[data-testid=halt-${failing}]`, { hasText: "failing: attempt 1" }).waitFor();
    await page.locator(`[data-testid=failing-count].bad`, { hasText: "1 failing" }).waitFor();
    await page.locator(`tr.failing[data-key=${failing}]`).waitFor();
    step(`retry ${failing} now`);
    await page.locator(`[data-testid=retry-${failing}]`).click();
    await page.locator(`[data-testid=halt-${failing}]`, { hasText: "delivering" }).waitFor();
    await page.locator(`[data-testid=failing-count].ok`, { hasText: "0 failing" }).waitFor();
    if (problems.length) throw new Error(problems.join("\n"));
    step("done");
    await browser.close();
    process.exit(0);
  }

  step("load the streams view");
  await page.goto(`${url}/console#/streams`);
  const link = page.locator("[data-testid=streams]").getByRole("link", { name: stream, exact: true });
  await link.waitFor();
  step("what needs someone comes first");
  await page.locator(`[data-testid=attention-halted]`, { hasText: subscription }).waitFor();
  const first = await page.locator(`[data-testid=streams] tbody tr`).first().getAttribute("data-path");
  if (first !== stream) throw new Error(`the stream with a halted subscription is not listed first (${first} is)`);
  await page.locator(`[data-testid=streams] tr[data-path="${stream}"]`, { hasText: "1 halted" }).waitFor();
  if (shots) await page.screenshot({ path: `${shots}/console-streams.png` });

  step(`open ${stream}`);
  await link.click();
  await page.locator(`[data-testid=events] tr[data-offset]`).first().waitFor();
  await page.locator(`[data-testid=halt-${subscription}]`, { hasText: "halted" }).waitFor();

  step("health leads the page");
  await page.locator(`[data-testid=halted-count].bad`, { hasText: "1 halted" }).waitFor();
  const healthFirst = await page.evaluate(() => {
    const health = document.querySelector("[data-testid=health]");
    const events = document.querySelector("[data-testid=events]");
    return Boolean(health.compareDocumentPosition(events) & Node.DOCUMENT_POSITION_FOLLOWING);
  });
  if (!healthFirst) throw new Error("the health line does not come before the events");

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

  step(`the story of event ${args.traced}`);
  await page.locator(`[data-testid=trace-${args.traced}]`).click();
  await page.locator(`[data-testid=trace-event]`, { hasText: "events.example/effects-requested" }).waitFor();
  await page.locator(`[data-testid=trace-downstream] [data-kind=wake]`, { hasText: "effector" }).first().waitFor();
  await page.locator(`[data-testid=trace-downstream] [data-kind=effect]`, { hasText: "confirm-1" }).first().waitFor();
  await page.locator(`[data-testid=trace-downstream]`, { hasText: "/orders/confirmed@" }).waitFor();
  if (shots) await page.screenshot({ path: `${shots}/console-trace.png`, fullPage: true });

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
