// VS Code end-to-end test: code-server with the packaged extension in a fresh profile, driven by
// playwright-core in headless Debian Chromium, all on 127.0.0.1, against the real server and the
// real default models. For a Python and a Rust file it types a prefix, waits for the ghost text to
// come by itself (no trigger command) while the suggest widget asks the server too (quick
// suggestions on), presses Tab and saves; it writes what was inserted to $WORK/result.json, where
// test_editors.py checks it against the text the server sent (telemetry, text opt-in) and the
// "accepted" outcome. Then, counting the requests in the LSP trace (specdec.trace.server), it checks
// that nothing is asked for a markdown file (the default specdec.enable), in manual mode until Alt+\,
// and while snoozed. On failure it saves a screenshot and the extension's logs (the server's stderr,
// with -v, and the LSP trace).
//
// Environment: CODE_SERVER, VSIX, SPECDEC (the specdec executable, linked into the project's
// .venv/bin for the extension to find), WORK (an empty temp folder;
// failure.png and server-*.log land there too), SCREENSHOT (optional: a PNG of the first ghost
// text), TIMEOUT_MS (optional: the longest wait for one step).
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { chromium } from 'playwright-core';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const CODE_SERVER = env('CODE_SERVER');
const VSIX = env('VSIX');
const SPECDEC = env('SPECDEC');
const WORK = env('WORK');
const SCREENSHOT = process.env.SCREENSHOT;
const TIMEOUT_MS = Number(process.env.TIMEOUT_MS || 600_000);
// Once the models are loaded, one short completion takes seconds even on a busy CPU.
const COMPLETION_TIMEOUT_MS = 180_000;

// Each case: a file with some context, and a prefix typed at its end. Mid-line prefixes make the
// server complete the rest of one line.
const CASES = [
  { file: 'greet.py', context: 'import sys\n\n\ndef greet(name):\n    ', typed: 'print("Hello, " + name' },
  { file: 'main.rs', context: 'fn main() {\n    let name = "world";\n    ', typed: 'println!("Hello, {}", name', after: '\n}\n' },
];
// Files that should get no ghost text: markdown (off by default), and one for manual mode and snooze.
// The typed text ends after a non-word character, so that no suggest widget is open at the end.
const QUIET = {
  markdown: { file: 'notes.md', context: '# Notes\n\nThe quick brown fox ', typed: 'jumps over the lazy dog, ' },
  python: { file: 'count.py', context: 'def count(items):\n    total = 0\n    for item in items:\n        ' },
};
// How long a check that nothing comes waits: several times a short completion's latency here.
const QUIET_MS = 5000;

const log = (msg) => console.error(`[vscode] ${msg}`);

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on('error', reject);
  });
}

function writeSettings(userDir) {
  // code-server is a remote-style host: machine-scoped settings (the server's arguments) are read
  // from the Machine settings, as a user sets them under "Remote" in the settings editor. No
  // specdec.server.command: the extension finds the server in the workspace's .venv (main()).
  const machine = { 'specdec.server.args': ['-v'] };
  const user = {
    // fp32 weights, as in neovim_test.lua: int8 (the default on CPUs with VNNI) completes some cases with nothing
    'specdec.quantization': 'none',
    'specdec.maxTokens.singleLine': 8,
    'specdec.maxTokens.multiLine': 16,
    'specdec.minConfidence': 0, // the confidence gate may hide these few cases; this test is about the editor
    'specdec.telemetry.enabled': true,
    'specdec.telemetry.path': path.join(WORK, 'events.jsonl'),
    'specdec.telemetry.includeText': true,
    'specdec.trace.server': 'messages',
    // Keep the editor from changing what is typed.
    'editor.autoClosingBrackets': 'never',
    'editor.autoClosingQuotes': 'never',
    'editor.autoIndent': 'none',
    // The suggest widget asks for completions as you type, beside the ghost text's requests. ("on":
    // VS Code's default "offWhenInlineCompletions" asks the widget only when no ghost text came within
    // 750 ms, a race a shared 2-core machine would make flaky.)
    'editor.quickSuggestions': { other: 'on', comments: 'off', strings: 'off' },
    'editor.inlineSuggest.enabled': true,
    'workbench.startupEditor': 'none',
    'workbench.tips.enabled': false,
    'workbench.secondarySideBar.defaultVisibility': 'hidden',
    'chat.disableAIFeatures': true,
    'security.workspace.trust.enabled': false,
    'telemetry.telemetryLevel': 'off',
    'extensions.autoCheckUpdates': false,
    'extensions.autoUpdate': false,
    'extensions.ignoreRecommendations': true,
    'update.mode': 'none',
  };
  for (const [dir, settings] of [['Machine', machine], ['User', user]]) {
    fs.mkdirSync(path.join(userDir, dir), { recursive: true });
    fs.writeFileSync(path.join(userDir, dir, 'settings.json'), JSON.stringify(settings, null, 2));
  }
}

async function startCodeServer(port, userDir, extDir, folder) {
  const args = [
    '--auth', 'none', '--bind-addr', `127.0.0.1:${port}`, '--disable-telemetry', '--disable-update-check',
    '--disable-workspace-trust', '--config', path.join(WORK, 'code-server.yaml'), '--user-data-dir', userDir, '--extensions-dir', extDir, folder,
  ];
  // Without a specdec on PATH, so that the extension must find the workspace's .venv/bin/specdec.
  const PATH = process.env.PATH.split(path.delimiter).filter((d) => !fs.existsSync(path.join(d, 'specdec'))).join(path.delimiter);
  const proc = spawn(CODE_SERVER, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, PATH } });
  const out = fs.createWriteStream(path.join(WORK, 'code-server.log'));
  proc.stdout.pipe(out);
  proc.stderr.pipe(out);
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('code-server did not start in 120 s')), 120_000);
    const onData = (chunk) => {
      if (String(chunk).includes('HTTP server listening')) {
        clearTimeout(timer);
        resolve();
      }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code) => reject(new Error(`code-server exited with ${code}`)));
  });
  return proc;
}

// Line text from the DOM uses U+00A0 for spaces.
const plain = (s) => s.replace(/\u00a0/g, ' ');

async function openFile(page, name) {
  await page.keyboard.press('Control+P');
  const input = page.locator('.quick-input-widget input');
  await input.waitFor({ state: 'visible' });
  await input.fill(name);
  await page.locator('.quick-input-list .monaco-list-row', { hasText: name }).first().waitFor({ timeout: 30_000 });
  await page.keyboard.press('Enter');
  await page.locator(`.tab.active[aria-label*="${name}"], .tab.active:has-text("${name}")`).first().waitFor();
  await page.locator('.editor-group-container.active .monaco-editor textarea').first().waitFor({ state: 'attached' });
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

async function runCase(page, folder, c, shotPath) {
  const file = path.join(folder, c.file);
  log(`${c.file}: opening`);
  await openFile(page, c.file);
  await page.locator('.editor-group-container.active .monaco-editor .view-lines').first().click();
  // End of the context: the cursor goes where the typed prefix belongs.
  await page.keyboard.press('Control+End');
  for (let i = 0; i < (c.after || '').split('\n').length - 1; i++) await page.keyboard.press('ArrowUp');
  await page.keyboard.press('End');
  const typedAt = Date.now();
  await page.keyboard.type(c.typed, { delay: 30 });
  log(`${c.file}: typed ${JSON.stringify(c.typed)}; waiting for ghost text (no trigger command)`);
  const ghost = page.locator(GHOST);
  await ghost.first().waitFor({ state: 'visible', timeout: COMPLETION_TIMEOUT_MS });
  await page.waitForTimeout(300); // let the rest of a multi-part ghost text render
  let shown = plain((await ghost.allInnerTexts()).join(''));
  const widget = page.locator(SUGGEST_WIDGET);
  const suggest = (await widget.count()) ? plain(await widget.innerText()) : null;
  log(`${c.file}: ghost text ${JSON.stringify(shown)} after ${Date.now() - typedAt} ms; suggest widget ${JSON.stringify(suggest)}`);
  if (shotPath) await page.screenshot({ path: shotPath });
  if (suggest !== null) {
    // Tab would take the widget's selected item (a word from the file, or specdec's own): close the
    // widget, as a user does who wants the ghost text, and bring the ghost text back if it went too.
    await page.keyboard.press('Escape');
    await widget.waitFor({ state: 'hidden' });
    if (!(await ghost.count())) {
      await page.keyboard.press('Alt+Backslash');
      await ghost.first().waitFor({ state: 'visible', timeout: COMPLETION_TIMEOUT_MS });
      await page.waitForTimeout(300);
    }
    shown = plain((await ghost.allInnerTexts()).join(''));
    log(`${c.file}: suggest widget closed; ghost text ${JSON.stringify(shown)}`);
  }
  await page.keyboard.press('Tab');
  // Save until the file holds more than was typed: the edit lands a moment after the key press.
  const after = c.after || '';
  const expectedStart = c.context + c.typed;
  const deadline = Date.now() + 30_000;
  let saved;
  do {
    await page.waitForTimeout(300);
    await page.keyboard.press('Control+S');
    await page.waitForTimeout(300);
    saved = fs.readFileSync(file, 'utf8');
  } while ((saved === c.context + after || saved === expectedStart + after) && Date.now() < deadline);
  if (!saved.startsWith(expectedStart) || !saved.endsWith(after)) {
    throw new Error(`${c.file}: saved file does not hold the typed prefix:\n${saved}`);
  }
  const inserted = saved.slice(expectedStart.length, saved.length - after.length);
  log(`${c.file}: inserted ${JSON.stringify(inserted)}`);
  if (!inserted) throw new Error(`${c.file}: Tab inserted nothing`);
  return { file: c.file, text: inserted, ghost: shown, suggest };
}

const GHOST = '.editor-group-container.active [class*="ghost-text"]';
const SUGGEST_WIDGET = '.editor-group-container.active .suggest-widget.visible';

// The extension's output channels are files under the profile's logs: "specdec" (its log, with the
// server's stderr) and "specdec LSP trace" (specdec.trace.server).
function channelFile(pattern) {
  const logs = path.join(WORK, 'user', 'logs');
  if (!fs.existsSync(logs)) return undefined;
  const found = fs.readdirSync(logs, { recursive: true }).map(String).filter((f) => pattern.test(path.basename(f)));
  return found.length ? path.join(logs, found.sort().at(-1)) : undefined;
}

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

async function main() {
  const userDir = path.join(WORK, 'user');
  const extDir = path.join(WORK, 'extensions');
  const folder = path.join(WORK, 'project');
  fs.mkdirSync(folder, { recursive: true });
  for (const c of [...CASES, ...Object.values(QUIET)]) fs.writeFileSync(path.join(folder, c.file), c.context + (c.after || ''));
  fs.mkdirSync(path.join(folder, '.venv', 'bin'), { recursive: true });
  fs.symlinkSync(SPECDEC, path.join(folder, '.venv', 'bin', 'specdec'));
  writeSettings(userDir);
  log('installing the extension');
  execFileSync(CODE_SERVER, ['--config', path.join(WORK, 'code-server.yaml'), '--user-data-dir', userDir, '--extensions-dir', extDir, '--install-extension', VSIX],
    { stdio: 'inherit' });

  const port = await freePort();
  const server = await startCodeServer(port, userDir, extDir, folder);
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 720 } });
  page.setDefaultTimeout(60_000);
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
    const results = [];
    for (const [i, c] of CASES.entries()) {
      results.push(await runCase(page, folder, c, i === 0 ? SCREENSHOT : undefined));
    }
    // The accept command reaches the server right after the edit; give it a moment to be logged.
    await page.waitForTimeout(2000);
    const requests = traced();
    log(`requests so far: ${JSON.stringify(requests)}`);
    if (!requests.inline || !requests.completion) {
      throw new Error(`expected both inline and suggest-widget completion requests: ${JSON.stringify(requests)}`);
    }
    const gating = await checkGating(page, status);
    await checkCommands(page, status);
    const statusText = plain(await status.innerText());
    log(`status bar: ${statusText}`);
    // specdec.server.args ["-v"]: the server's INFO lines reach the "specdec" channel.
    const extensionLog = fs.readFileSync(channelFile(/^specdec\.log$/) ?? '/dev/null', 'utf8');
    const serverInfo = extensionLog.split('\n').filter((l) => l.includes('[server] INFO')).length;
    if (!serverInfo) throw new Error('no INFO line of the server (-v) in the specdec output channel');
    const found = /found through ([^)]*)\)/.exec(extensionLog)?.[1];
    if (found !== 'the workspace .venv') throw new Error(`the server was found through ${found}, not the workspace .venv`);
    fs.writeFileSync(
      path.join(WORK, 'result.json'),
      JSON.stringify({ cases: results, status: statusText, requests, serverInfoLines: serverInfo, found, ...gating }, null, 2),
    );
    log('all cases passed');
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
