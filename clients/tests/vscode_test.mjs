// VS Code end-to-end test: code-server with the packaged extension in a fresh profile, driven by
// playwright-core in headless Debian Chromium, all on 127.0.0.1, against the real server and the
// real default models. For a Python and a Rust file it types a prefix, waits for the ghost text,
// presses Tab and saves; it writes what was inserted to $WORK/result.json, where test_editors.py
// checks it against the text the server sent (telemetry, text opt-in) and the "accepted" outcome.
// On failure it saves a screenshot and the extension's log (which holds the server's stderr).
//
// Environment: CODE_SERVER, VSIX, SPECDEC (the specdec executable), WORK (an empty temp folder;
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
  // code-server is a remote-style host: machine-scoped settings (the server command) are read from
  // the Machine settings, as a user sets them under "Remote" in the settings editor.
  const machine = { 'specdec.server.command': SPECDEC };
  const user = {
    // fp32 weights, as in neovim_test.lua: int8 (the default on CPUs with VNNI) completes some cases with nothing
    'specdec.quantization': 'none',
    'specdec.maxTokens.singleLine': 8,
    'specdec.maxTokens.multiLine': 16,
    'specdec.telemetry.enabled': true,
    'specdec.telemetry.path': path.join(WORK, 'events.jsonl'),
    'specdec.telemetry.includeText': true,
    // Keep the editor from changing what is typed, and the suggest widget from taking Tab.
    'editor.autoClosingBrackets': 'never',
    'editor.autoClosingQuotes': 'never',
    'editor.autoIndent': 'none',
    'editor.quickSuggestions': { other: 'off', comments: 'off', strings: 'off' },
    'editor.suggestOnTriggerCharacters': false,
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
  const proc = spawn(CODE_SERVER, args, { stdio: ['ignore', 'pipe', 'pipe'] });
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
  await page.keyboard.type(c.typed, { delay: 30 });
  log(`${c.file}: typed ${JSON.stringify(c.typed)}; waiting for ghost text`);
  const ghost = page.locator('.editor-group-container.active [class*="ghost-text"]');
  await ghost.first().waitFor({ state: 'visible', timeout: COMPLETION_TIMEOUT_MS });
  await page.waitForTimeout(300); // let the rest of a multi-part ghost text render
  const shown = plain((await ghost.allInnerTexts()).join(''));
  log(`${c.file}: ghost text ${JSON.stringify(shown)}`);
  if (shotPath) await page.screenshot({ path: shotPath });
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
  return { file: c.file, text: inserted, ghost: shown };
}

function saveServerLog() {
  // The language client writes the server's stderr to the extension's output channel log.
  const logs = path.join(WORK, 'user', 'logs');
  if (!fs.existsSync(logs)) return;
  for (const entry of fs.readdirSync(logs, { recursive: true })) {
    const full = path.join(logs, String(entry));
    if (fs.statSync(full).isFile() && /specdec/i.test(path.basename(full))) {
      fs.copyFileSync(full, path.join(WORK, `server-${path.basename(full)}`));
    }
  }
}

async function main() {
  const userDir = path.join(WORK, 'user');
  const extDir = path.join(WORK, 'extensions');
  const folder = path.join(WORK, 'project');
  fs.mkdirSync(folder, { recursive: true });
  for (const c of CASES) fs.writeFileSync(path.join(folder, c.file), c.context + (c.after || ''));
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
    await checkCommands(page, status);
    const statusText = plain(await status.innerText());
    log(`status bar: ${statusText}`);
    fs.writeFileSync(path.join(WORK, 'result.json'), JSON.stringify({ cases: results, status: statusText }, null, 2));
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
