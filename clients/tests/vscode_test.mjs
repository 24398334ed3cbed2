// VS Code end-to-end test: code-server with the packaged extension in a fresh profile, driven by
// playwright-core in headless Debian Chromium, all on 127.0.0.1, against the real server and the
// real default models, on VS Code's and specdec's defaults (auto-closed brackets and quotes,
// auto-indent, quick suggestions, the server's quantization, limits and confidence gate).
// The pause table: 14 pauses (PAUSES) typed key by key, each waiting for ghost text to come by
// itself; for each, whether it showed, its line as drawn, the milliseconds from the last key press to
// the ghost text in the DOM, and (telemetry) why an empty answer was empty. Two more pauses, at the
// end of a finished line (LINE_END_PAUSES), go in the table and apart in the JSON. In a bracket case of each
// language Tab accepts the item and the saved file must hold the line as drawn, its auto-closed
// bracket once. The table goes to $WORK/pauses.json with the status bar's latency beside the
// measured p50. Then Ctrl+Space (the suggest widget asks the server too), and, counting the requests
// in the LSP trace (specdec.trace.server), that nothing is asked for a markdown file (the default
// specdec.enable), in manual mode until Alt+\, and while snoozed; the commands; the server's INFO
// lines. What was accepted goes to $WORK/result.json, where test_editors.py checks it against the
// text the server sent (telemetry, text opt-in) and the "accepted" outcome. On failure it saves a
// screenshot and the extension's logs (the server's stderr, with -v, and the LSP trace).
//
// Environment: CODE_SERVER, VSIX, SPECDEC (the specdec executable, linked into the project's
// .venv/bin for the extension to find), WORK (an empty temp folder;
// failure.png and server-*.log land there too), SCREENSHOT (optional: a PNG of the first ghost
// text), SCREENSHOT_DIR (optional: vscode-bracket-python.png and vscode-bracket-rust.png, the
// accepted bracket cases' ghost text before Tab), TIMEOUT_MS (optional: the
// longest wait for the models to load).
import fs from 'node:fs';
import path from 'node:path';
import {
  GHOST, QUIET_WORKBENCH, SUGGEST_WIDGET, channelFile as profileLog, freePort, installExtension, launchBrowser, openFile, plain,
  requireEnv, startCodeServer, writeSettings,
} from './code_server.mjs';

const CODE_SERVER = requireEnv('CODE_SERVER');
const VSIX = requireEnv('VSIX');
const SPECDEC = requireEnv('SPECDEC');
const WORK = requireEnv('WORK');
const SCREENSHOT = process.env.SCREENSHOT;
const SCREENSHOT_DIR = process.env.SCREENSHOT_DIR;
const TIMEOUT_MS = Number(process.env.TIMEOUT_MS || 600_000);
// Once the models are loaded, one short completion takes seconds even on a busy CPU.
const COMPLETION_TIMEOUT_MS = 180_000;

// The pause table: 14 scripted pauses, 7 in Python and 7 in Rust, each in its own file, typed key by
// key at the end of `context` (the file is `context + after`). Three kinds: mid-line (nothing after the
// cursor), new-line (the last key is Enter inside a block, VS Code's auto-indent placing the cursor) and
// bracket (the typed text opens a bracket that VS Code closes, so `closers` sits right after the
// cursor when the user pauses: the answer the user wants runs past it, the item retyping it). In the
// first bracket case of each language whose ghost text runs past the bracket, Tab accepts it and the
// saved file is checked against what was drawn (no doubled `)`).
// LINE_END_PAUSES: at the end of a finished statement line, without Enter (the server's answer is the
// next line: "\n" + its indentation + the line, an item whose range is empty at the cursor, which VS Code
// draws below the line). Outside the 14 above, reported apart from them; in the first that shows, Tab
// accepts and the saved file must hold the server's text exactly (its indentation once).
// Both lists and the pace live in pauses.json, which neovim_test.lua types too (one script, two editors).
const SCRIPT = JSON.parse(fs.readFileSync(new URL('./pauses.json', import.meta.url), 'utf8'));
const PAUSES = SCRIPT.pauses;
const LINE_END_PAUSES = SCRIPT.lineEnd;
const languageOf = (file) => (file.endsWith('.py') ? 'python' : 'rust');
// Keys typed at about 12 a second (80 ms), a quick typist's pace.
const KEY_DELAY_MS = SCRIPT.keyDelayMs;
// How long a pause waits for ghost text before counting it as not shown (30 s): far above the keystroke
// to ghost text latency here (one to five seconds), so a miss is an empty answer, not a slow one.
const PAUSE_TIMEOUT_MS = SCRIPT.pauseTimeoutMs;
// A file where Ctrl+Space opens the suggest widget, which asks the server (textDocument/completion).
const SUGGEST = { file: 'square.py', context: 'def square(x):\n    return x * ' };
// Files that should get no ghost text: markdown (off by default), and one for manual mode and snooze.
// The typed text ends after a non-word character, so that no suggest widget is open at the end.
const QUIET = {
  markdown: { file: 'notes.md', context: '# Notes\n\nThe quick brown fox ', typed: 'jumps over the lazy dog, ' },
  python: { file: 'count.py', context: 'def count(items):\n    total = 0\n    for item in items:\n        ' },
};
// How long a check that nothing comes waits: several times a short completion's latency here.
const QUIET_MS = 5000;

const log = (msg) => console.error(`[vscode] ${msg}`);

function settings() {
  // code-server is a remote-style host: machine-scoped settings (the server's arguments) are read
  // from the Machine settings, as a user sets them under "Remote" in the settings editor. No
  // specdec.server.command: the extension finds the server in the workspace's .venv (main()).
  const machine = { 'specdec.server.args': ['-v'] };
  // The editor's and specdec's defaults (auto-closed brackets and quotes, auto-indent, quick
  // suggestions "offWhenInlineCompletions", the server's quantization, token limits and confidence
  // gate), as a new user has them; only telemetry (with text, to check what was inserted) and the
  // LSP trace (to count requests) are turned on, and the workbench's first-run distractions off.
  const user = {
    'specdec.telemetry.enabled': true,
    'specdec.telemetry.path': path.join(WORK, 'events.jsonl'),
    'specdec.telemetry.includeText': true,
    'specdec.trace.server': 'messages',
    ...QUIET_WORKBENCH,
  };
  return { Machine: machine, User: user };
}

// Without a specdec on PATH, so that the extension must find the workspace's .venv/bin/specdec.
function withoutSpecdec() {
  const PATH = process.env.PATH.split(path.delimiter).filter((d) => !fs.existsSync(path.join(d, 'specdec'))).join(path.delimiter);
  return { ...process.env, PATH };
}

async function runCommand(page, title) {
  await page.keyboard.press('F1');
  const input = page.locator('.quick-input-widget input');
  await input.waitFor({ state: 'visible' });
  await input.fill(`>${title}`);
  await page.locator('.quick-input-list .monaco-list-row', { hasText: title }).first().waitFor({ timeout: 30_000 });
  await page.keyboard.press('Enter');
}

// The commands besides completion: disable / enable (the status bar follows) and the telemetry
// report (`specdec report` into a temp folder, report.md opened).
async function checkCommands(page, status) {
  await runCommand(page, 'specdec: Disable Completions');
  await status.locator('.codicon-circle-slash').waitFor({ timeout: 30_000 });
  await runCommand(page, 'specdec: Enable Completions');
  await status.locator('.codicon-check').waitFor({ timeout: 30_000 });
  log('disable / enable: status bar follows');
  await runCommand(page, 'specdec: Open Telemetry Report');
  await page.locator('.tab', { hasText: 'report.md' }).first().waitFor({ timeout: 180_000 });
  log('telemetry report opened');
}

// Keystroke to ghost text, timed in the page: a capturing keydown listener stamps each key press
// and a MutationObserver stamps the first moment after it that the active editor holds non-empty
// ghost text (each key press starts over, so a pause's figure runs from its last key).
async function installGhostClock(page) {
  await page.evaluate((selector) => {
    const clock = { key: null, ghost: null };
    window.__specdecClock = clock;
    const shown = () => [...document.querySelectorAll(selector)].some((e) => e.textContent.trim());
    window.addEventListener('keydown', () => {
      clock.key = performance.now();
      clock.ghost = null;
    }, true);
    new MutationObserver(() => {
      if (clock.key !== null && clock.ghost === null && shown()) clock.ghost = performance.now();
    }).observe(document.body, { childList: true, subtree: true, characterData: true, attributes: true, attributeFilter: ['class'] });
  }, GHOST);
}

// The document line that holds the ghost text, as drawn: its text with the ghost parts in place. (Only
// the editor's own lines, not the view zone that draws a multi-line ghost text's further lines.)
async function ghostLine(page) {
  return page.evaluate((selector) => {
    const lines = [...document.querySelectorAll(selector)]
      .filter((e) => e.textContent.trim())
      .map((e) => e.closest('.view-line'))
      .filter((line) => line && line.parentElement.classList.contains('view-lines'));
    return lines.length ? lines[0].textContent : null;
  }, GHOST).then((line) => (line === null ? null : plain(line)));
}

// The ghost text drawn below the cursor's line (the view zone of a multi-line ghost text), its lines.
async function ghostBelow(page) {
  return page.evaluate((selector) => {
    const zones = [...new Set([...document.querySelectorAll(selector)]
      .filter((e) => e.textContent.trim() && !e.closest('.view-lines'))
      .map((e) => e.closest('.suggest-preview-text') ?? e))];
    return zones.length ? zones.map((z) => [...z.querySelectorAll('.view-line')].map((l) => l.textContent).join('\n') || z.textContent).join('\n') : null;
  }, GHOST).then((text) => (text === null ? null : plain(text)));
}

async function typeKeys(page, keys) {
  const lines = keys.split('\n');
  for (const [i, line] of lines.entries()) {
    if (i > 0) {
      await page.waitForTimeout(KEY_DELAY_MS);
      await page.keyboard.press('Enter');
    }
    if (line) await page.keyboard.type(line, { delay: KEY_DELAY_MS });
  }
}

// Saves until the file differs from `before` (the edit lands a moment after the key press).
async function saveUntilChanged(page, file, before) {
  const deadline = Date.now() + 30_000;
  let saved;
  do {
    await page.waitForTimeout(300);
    await page.keyboard.press('Control+S');
    await page.waitForTimeout(300);
    saved = fs.readFileSync(file, 'utf8');
  } while (saved === before && Date.now() < deadline);
  return saved;
}

const count = (text, ch) => text.split(ch).length - 1;
// A line with each bracket pair and the double quotes balanced: a doubled or lost closer shows here.
const balanced = (line) => [['(', ')'], ['[', ']'], ['{', '}']].every(([open, close]) => count(line, open) === count(line, close)) && count(line, '"') % 2 === 0;

// Tab on the ghost text of a bracket case, then the saved file: the typed prefix, the item, and the
// rest of the file, with the auto-closed bracket once (the item retyped it, or went in before it), and
// the accepted line exactly as it was drawn.
async function acceptBracket(page, folder, p, record, shotDir) {
  const widget = page.locator(SUGGEST_WIDGET);
  let drawn = record.line;
  if (await widget.count()) {
    // Tab would take the widget's selected item: close it, as a user does who wants the ghost text,
    // and bring the ghost text back if it went too.
    await page.keyboard.press('Escape');
    await widget.waitFor({ state: 'hidden' });
    if (!(await ghostLine(page))) {
      await page.keyboard.press('Alt+Backslash');
      await page.locator(GHOST).first().waitFor({ state: 'visible', timeout: COMPLETION_TIMEOUT_MS });
      await page.waitForTimeout(300);
    }
    drawn = await ghostLine(page);
    log(`${p.id}: suggest widget closed; line drawn ${JSON.stringify(drawn)}`);
  }
  if (shotDir) await page.screenshot({ path: path.join(shotDir, `vscode-bracket-${record.language}.png`) });
  const file = path.join(folder, p.file);
  const prefix = p.context + p.typed;
  const before = prefix + p.closers + p.after;
  await page.keyboard.press('Tab');
  const saved = await saveUntilChanged(page, file, before);
  if (!saved.startsWith(prefix) || !saved.endsWith(p.after)) {
    throw new Error(`${p.id}: the saved file lost the typed prefix or what followed:\n${saved}`);
  }
  const inserted = saved.slice(prefix.length, saved.length - p.after.length);
  const line = saved.split('\n')[prefix.split('\n').length - 1];
  log(`${p.id}: Tab inserted ${JSON.stringify(inserted)}; line ${JSON.stringify(line)}`);
  if (!inserted.split('\n')[0].includes(p.closers)) throw new Error(`${p.id}: the closing ${p.closers} went: ${JSON.stringify(line)}`);
  if (!balanced(line)) throw new Error(`${p.id}: unbalanced brackets or quotes (a doubled closer?): ${JSON.stringify(line)}`);
  if (line !== drawn) throw new Error(`${p.id}: saved line ${JSON.stringify(line)} is not the line drawn ${JSON.stringify(drawn)}`);
  return { id: p.id, file: p.file, language: languageOf(p.file), text: inserted, closers: p.closers, line, drawn };
}

// Tab on a line-end pause's ghost text: the saved file must hold the typed line, then what Tab
// inserted, then what followed; test_editors.py and main() hold the inserted text against the server's.
async function acceptLineEnd(page, folder, p, record) {
  const widget = page.locator(SUGGEST_WIDGET);
  if (await widget.count()) {
    await page.keyboard.press('Escape');
    await widget.waitFor({ state: 'hidden' });
  }
  if (!(await page.locator(GHOST).count())) throw new Error(`${p.id}: the ghost text went before Tab`);
  const file = path.join(folder, p.file);
  const prefix = p.context + p.typed;
  await page.keyboard.press('Tab');
  const saved = await saveUntilChanged(page, file, prefix + p.after);
  if (!saved.startsWith(prefix) || !saved.endsWith(p.after)) {
    throw new Error(`${p.id}: the saved file lost the typed line or what followed:\n${saved}`);
  }
  const inserted = saved.slice(prefix.length, saved.length - p.after.length);
  log(`${p.id}: Tab inserted ${JSON.stringify(inserted)}`);
  return { id: p.id, file: p.file, language: languageOf(p.file), text: inserted, below: record.below };
}

// One pause: open its file, put the cursor at the end of the context, type the keys, and wait for
// ghost text to come by itself (no trigger command).
async function runPause(page, folder, p, shots) {
  await openFile(page, p.file);
  await page.locator('.editor-group-container.active .monaco-editor .view-lines').first().click();
  await page.keyboard.press('Control+Home');
  for (let i = 0; i < p.context.split('\n').length - 1; i++) await page.keyboard.press('ArrowDown');
  await page.keyboard.press('End');
  const started = Date.now();
  await typeKeys(page, p.typed);
  const record = { id: p.id, language: languageOf(p.file), kind: p.kind, typed: p.typed, shown: false, ms: null, ghost: null, line: null };
  try {
    await page.waitForFunction(() => window.__specdecClock.ghost !== null, null, { timeout: PAUSE_TIMEOUT_MS, polling: 50 });
  } catch {
    // no ghost text: the table says so, and why (the telemetry's empty_reason), below
  }
  const clock = await page.evaluate(() => window.__specdecClock);
  if (clock.ghost !== null) {
    await page.waitForTimeout(300); // let the rest of a multi-part ghost text render
    record.shown = true;
    record.ms = Math.round(clock.ghost - clock.key);
    record.ghost = plain((await page.locator(GHOST).allInnerTexts()).join('')) || null;
    record.line = await ghostLine(page);
    if (p.kind === 'line-end') record.below = await ghostBelow(page);
  }
  record.suggestWidget = (await page.locator(SUGGEST_WIDGET).count()) > 0;
  if (p.closers && record.line !== null) {
    // Past the bracket: the drawn line holds the closer with more than closers after it.
    const typedLine = (p.context + p.typed).split('\n').at(-1);
    const rest = record.line.startsWith(typedLine) ? record.line.slice(typedLine.length) : '';
    record.pastBracket = rest.includes(p.closers) && !/^[)\]}"'\s]*$/.test(rest.slice(rest.indexOf(p.closers)));
    record.balanced = balanced(record.line);
  }
  log(`${p.id}: ${record.shown ? `ghost text ${JSON.stringify(record.ghost)} ${record.ms} ms after the last key; line ${JSON.stringify(record.line)}` : `no ghost text in ${PAUSE_TIMEOUT_MS} ms`}`);
  if (record.shown && shots.first) {
    await page.screenshot({ path: shots.first });
    shots.first = undefined;
  }
  return { record, started };
}

// The extension's output channels are files under the profile's logs: "specdec" (its log, with the
// server's stderr) and "specdec LSP trace" (specdec.trace.server).
const channelFile = (pattern) => profileLog(path.join(WORK, 'user'), pattern);

// What the client has sent so far, from the LSP trace.
function traced() {
  const file = channelFile(/specdec LSP trace\.log$/);
  const text = file ? fs.readFileSync(file, 'utf8') : '';
  const count = (s) => text.split(s).length - 1;
  return {
    inline: count("Sending request 'textDocument/inlineCompletion"),
    completion: count("Sending request 'textDocument/completion"),
    didChange: count("Sending notification 'textDocument/didChange'"),
  };
}

async function waitFor(what, predicate, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

async function openAtEnd(page, file) {
  await openFile(page, file);
  await page.locator('.editor-group-container.active .monaco-editor .view-lines').first().click();
  await page.keyboard.press('Control+End');
}

// Types `typed` and checks that, for QUIET_MS, no ghost text shows and no completion request of
// either kind leaves the client (the trace must show the typing itself, so it is being written).
async function expectQuiet(page, name, typed) {
  const before = traced();
  await page.keyboard.type(typed, { delay: 30 });
  await waitFor(`the trace of typing in ${name}`, () => traced().didChange > before.didChange, 30_000);
  await page.waitForTimeout(QUIET_MS);
  const after = traced();
  if (await page.locator(GHOST).count()) throw new Error(`${name}: ghost text showed`);
  if (after.inline !== before.inline || after.completion !== before.completion) {
    throw new Error(`${name}: completion requests reached the server: ${JSON.stringify({ before, after })}`);
  }
  log(`${name}: no ghost text and no request in ${QUIET_MS} ms of typing (${after.didChange - before.didChange} changes sent)`);
  return { name, changes: after.didChange - before.didChange };
}

async function pick(page, label) {
  const input = page.locator('.quick-input-widget input');
  await input.waitFor({ state: 'visible' });
  await input.fill(label);
  await page.locator('.quick-input-list .monaco-list-row', { hasText: label }).first().waitFor({ timeout: 30_000 });
  await page.keyboard.press('Enter');
}

// The language deny-list, manual mode and snooze: nothing reaches the server, and (manual) Alt+\
// brings the ghost text.
async function checkGating(page, status) {
  const quiet = [];
  await openAtEnd(page, QUIET.markdown.file);
  await status.locator('.codicon-circle-slash').waitFor({ timeout: 30_000 }); // "off for markdown"
  quiet.push(await expectQuiet(page, 'markdown', QUIET.markdown.typed));

  await runCommand(page, 'specdec: Show Completions Only on Alt+');
  await openAtEnd(page, QUIET.python.file);
  await status.filter({ hasText: '(manual)' }).waitFor({ timeout: 30_000 });
  quiet.push(await expectQuiet(page, 'manual', 'total += '));
  if (await page.locator(SUGGEST_WIDGET).count()) await page.keyboard.press('Escape'); // its item would filter the ghost text
  const before = traced();
  await page.keyboard.press('Alt+Backslash');
  await page.locator(GHOST).first().waitFor({ state: 'visible', timeout: COMPLETION_TIMEOUT_MS });
  const manual = { ghost: plain((await page.locator(GHOST).allInnerTexts()).join('')), requests: traced().inline - before.inline };
  log(`manual: Alt+\\ brought ghost text ${JSON.stringify(manual.ghost)}`);
  await page.keyboard.press('Escape');
  await runCommand(page, 'specdec: Show Completions as You Type');
  await status.filter({ hasNotText: '(manual)' }).locator('.codicon-check').waitFor({ timeout: 30_000 });

  await runCommand(page, 'specdec: Snooze Completions');
  await pick(page, 'Snooze for 5 minutes');
  await status.filter({ hasText: 'snoozed' }).waitFor({ timeout: 30_000 });
  const snoozedText = plain(await status.innerText());
  log(`snooze: status bar ${JSON.stringify(snoozedText)}`);
  await page.locator('.editor-group-container.active .monaco-editor .view-lines').first().click();
  await page.keyboard.press('Control+End');
  quiet.push(await expectQuiet(page, 'snooze', 'total - 1, '));
  await runCommand(page, 'specdec: Resume Completions');
  await status.locator('.codicon-check').waitFor({ timeout: 30_000 });
  return { quiet, manual, snoozed: snoozedText };
}

function saveServerLog() {
  // The language client writes the server's stderr to the extension's output channel log.
  const logs = path.join(WORK, 'user', 'logs');
  if (!fs.existsSync(logs)) return;
  for (const entry of fs.readdirSync(logs, { recursive: true })) {
    const full = path.join(logs, String(entry));
    if (fs.statSync(full).isFile() && /specdec/i.test(path.basename(full))) {
      fs.copyFileSync(full, path.join(WORK, `server-${path.basename(full).replace(/[^\w.-]/g, '-')}`));
    }
  }
}

// The telemetry's answers (text opt-in) in each pause's time window: why an empty one was empty
// (empty_reason), so the table says why a pause drew nothing.
function attachAnswers(pauses) {
  const file = path.join(WORK, 'events.jsonl');
  const records = fs.existsSync(file) ? fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l)) : [];
  const events = records.filter((r) => r.record !== 'outcome');
  pauses.forEach(({ record, started }, i) => {
    const p = [...PAUSES, ...LINE_END_PAUSES].find((q) => q.id === record.id);
    const end = i + 1 < pauses.length ? pauses[i + 1].started : Infinity;
    const answers = events.filter((e) => e.language === record.language && e.time * 1000 >= started && e.time * 1000 < end);
    record.answers = answers.length;
    const empty = answers.filter((e) => e.outcome !== 'shown' && e.empty_reason);
    record.emptyReasons = Object.fromEntries([...new Set(empty.map((e) => e.empty_reason))].map((r) => [r, empty.filter((e) => e.empty_reason === r).length]));
    // The first answer shown, as the server sent it; in a bracket case, whether it retyped the closer
    // (the item's range covers it) or went in before it.
    record.answer = answers.find((e) => e.outcome === 'shown')?.text ?? null;
    if (p.closers && record.answer !== null) record.retyped = record.answer.split('\n')[0].includes(p.closers);
    if (!record.shown) record.reason = empty.at(-1)?.empty_reason ?? (answers.length ? answers.at(-1).outcome : 'no answer');
  });
}

const median = (xs) => {
  const sorted = [...xs].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length ? (sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2) : null;
};

function pauseTable(records) {
  const cell = (v) => (v === null || v === undefined ? '' : String(v).replace(/\|/g, '\\|').replace(/\n/g, '⏎'));
  const rows = records.map((r, i) => [i + 1, r.id, r.kind, `\`${cell(r.typed)}\``, r.shown ? 'yes' : 'no', r.ms ?? '',
    r.shown ? `\`${cell(r.kind === 'line-end' ? `${r.line ?? r.typed}\n${r.below ?? r.ghost}` : r.line ?? r.ghost)}\`` : '', r.pastBracket === undefined ? '' : r.pastBracket ? 'yes' : 'no', r.reason ?? '']);
  return ['| # | case | kind | typed | ghost text | ms | line drawn | past the bracket | why empty |', '|---|---|---|---|---|---|---|---|---|',
    ...rows.map((row) => `| ${row.join(' | ')} |`)].join('\n');
}

// The status bar's latency ("p50 812 ms"), whatever else the item says.
function statusLatencyMs(text) {
  const m = /p50\D{0,20}?(\d+(?:\.\d+)?)\s*ms/.exec(text) ?? /(\d+(?:\.\d+)?)\s*ms/.exec(text);
  return m ? Number(m[1]) : null;
}

async function main() {
  const userDir = path.join(WORK, 'user');
  const extDir = path.join(WORK, 'extensions');
  const folder = path.join(WORK, 'project');
  fs.mkdirSync(folder, { recursive: true });
  for (const c of [...PAUSES, ...LINE_END_PAUSES, SUGGEST, ...Object.values(QUIET)]) fs.writeFileSync(path.join(folder, c.file), c.context + (c.after || ''));
  fs.mkdirSync(path.join(folder, '.venv', 'bin'), { recursive: true });
  fs.symlinkSync(SPECDEC, path.join(folder, '.venv', 'bin', 'specdec'));
  writeSettings(userDir, settings());
  log('installing the extension');
  installExtension(CODE_SERVER, WORK, userDir, extDir, VSIX);

  const port = await freePort();
  const server = await startCodeServer(CODE_SERVER, WORK, { port, userDir, extDir, folder, env: withoutSpecdec() });
  const { browser, page } = await launchBrowser();
  let failed = false;
  try {
    await page.goto(`http://127.0.0.1:${port}/?folder=${encodeURIComponent(folder)}`);
    await page.locator('.monaco-workbench').waitFor({ timeout: 120_000 });
    log('workbench up; waiting for the server to load its models');
    const status = page.locator('.statusbar-item', { hasText: 'specdec' }).first();
    await status.waitFor({ timeout: 120_000 });
    await status.locator('.codicon-check, .codicon-error').first().waitFor({ timeout: TIMEOUT_MS });
    if (await status.locator('.codicon-error').count()) {
      throw new Error(`the server failed: ${await status.getAttribute('aria-label')}`);
    }
    log(`status bar: ${await status.innerText()}`);
    await installGhostClock(page);
    const pauses = [];
    const accepted = [];
    const shots = { first: SCREENSHOT };
    for (const p of PAUSES) {
      const pause = await runPause(page, folder, p, shots);
      pauses.push(pause);
      if (pause.record.pastBracket && !accepted.some((a) => a.language === pause.record.language)) {
        accepted.push(await acceptBracket(page, folder, p, pause.record, SCREENSHOT_DIR));
      } else {
        await page.keyboard.press('Escape');
      }
    }
    const lineEnds = [];
    let lineEndAccepted = null;
    for (const p of LINE_END_PAUSES) {
      const pause = await runPause(page, folder, p, shots);
      lineEnds.push(pause);
      if (pause.record.shown && !lineEndAccepted) lineEndAccepted = await acceptLineEnd(page, folder, p, pause.record);
      else await page.keyboard.press('Escape');
    }
    // The accept command reaches the server right after the edit, and the last answers' telemetry
    // is written as they finish: give them a moment.
    await page.waitForTimeout(2000);
    attachAnswers([...pauses, ...lineEnds]);
    const lineEndRecords = lineEnds.map((p) => p.record);
    if (lineEndAccepted) {
      // the server's text, first answer shown in that pause (telemetry, text opt-in)
      lineEndAccepted.sent = lineEndRecords.find((r) => r.id === lineEndAccepted.id).answer;
      if (lineEndAccepted.text !== lineEndAccepted.sent) {
        throw new Error(`${lineEndAccepted.id}: Tab inserted ${JSON.stringify(lineEndAccepted.text)}, the server sent ${JSON.stringify(lineEndAccepted.sent)}`);
      }
    }
    const records = pauses.map((p) => p.record);
    const measured = records.filter((r) => r.shown).map((r) => r.ms);
    const statusText = plain(await status.innerText());
    const latency = { statusBar: statusText, statusMs: statusLatencyMs(statusText), measuredP50Ms: median(measured) };
    latency.ratio = latency.statusMs && latency.measuredP50Ms ? Number((latency.statusMs / latency.measuredP50Ms).toFixed(2)) : null;
    const table = pauseTable([...records, ...lineEndRecords]);
    const lineEnd = { shown: lineEndRecords.filter((r) => r.shown).length, of: lineEndRecords.length, pauses: lineEndRecords, accepted: lineEndAccepted };
    const report = { shown: measured.length, of: records.length, latency, table, pauses: records, accepted, lineEnd };
    fs.writeFileSync(path.join(WORK, 'pauses.json'), JSON.stringify(report, null, 2));
    log(`pauses: ghost text at ${measured.length} of ${records.length}; line-end at ${lineEnd.shown} of ${lineEnd.of}\n${table}`);
    log(`status bar ${JSON.stringify(statusText)}: ${latency.statusMs} ms; keystroke to ghost text p50 ${latency.measuredP50Ms} ms; ratio ${latency.ratio}`);

    // The suggest widget's path: Ctrl+Space asks the server (textDocument/completion), as quick
    // suggestions do when no ghost text came in time.
    await openAtEnd(page, SUGGEST.file);
    const beforeSuggest = traced();
    await page.keyboard.press('Control+Space');
    await waitFor('the suggest widget\'s request', () => traced().completion > beforeSuggest.completion, 60_000);
    await page.keyboard.press('Escape');
    const requests = traced();
    log(`requests so far: ${JSON.stringify(requests)}`);
    if (!requests.inline || !requests.completion) {
      throw new Error(`expected both inline and suggest-widget completion requests: ${JSON.stringify(requests)}`);
    }
    const gating = await checkGating(page, status);
    await checkCommands(page, status);
    const finalStatus = plain(await status.innerText());
    log(`status bar: ${finalStatus}`);
    // specdec.server.args ["-v"]: the server's INFO lines reach the "specdec" channel.
    const extensionLog = fs.readFileSync(channelFile(/^specdec\.log$/) ?? '/dev/null', 'utf8');
    const serverInfo = extensionLog.split('\n').filter((l) => l.includes('[server] INFO')).length;
    if (!serverInfo) throw new Error('no INFO line of the server (-v) in the specdec output channel');
    const found = /found through ([^)]*)\)/.exec(extensionLog)?.[1];
    if (found !== 'the workspace .venv') throw new Error(`the server was found through ${found}, not the workspace .venv`);
    fs.writeFileSync(
      path.join(WORK, 'result.json'),
      JSON.stringify({ cases: accepted, lineEndAccepted, status: finalStatus, requests, serverInfoLines: serverInfo, found, ...gating }, null, 2),
    );
    log('all steps done');
  } catch (e) {
    failed = true;
    log(`FAIL: ${e.stack || e}`);
    await page.screenshot({ path: path.join(WORK, 'failure.png') }).catch(() => {});
    saveServerLog();
  } finally {
    await browser.close();
    server.kill();
  }
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  log(`FAIL: ${e.stack || e}`);
  process.exit(1);
});
