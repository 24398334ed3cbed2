// What both code-server drivers (vscode_test.mjs, vscode_install_test.mjs) do the same way: a fresh profile
// with the .vsix installed, code-server on 127.0.0.1, headless Debian Chromium on it, files opened by name,
// and the extension's output channels read from the profile's logs.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { chromium } from 'playwright-core';

export const requireEnv = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};

// Line text from the DOM uses U+00A0 for spaces.
export const plain = (s) => s.replace(/\u00a0/g, ' ');

export const GHOST = '.editor-group-container.active [class*="ghost-text"]';
export const SUGGEST_WIDGET = '.editor-group-container.active .suggest-widget.visible';

// The workbench's first-run distractions, off in every profile the drivers make.
export const QUIET_WORKBENCH = {
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

export function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on('error', reject);
  });
}

// `settings`: { User: {...}, Machine: {...} }, each written to the profile's settings.json of that scope.
export function writeSettings(userDir, settings) {
  for (const [scope, values] of Object.entries(settings)) {
    fs.mkdirSync(path.join(userDir, scope), { recursive: true });
    fs.writeFileSync(path.join(userDir, scope, 'settings.json'), JSON.stringify(values, null, 2));
  }
}

export function installExtension(codeServer, work, userDir, extDir, vsix) {
  execFileSync(codeServer, ['--config', path.join(work, 'code-server.yaml'), '--user-data-dir', userDir, '--extensions-dir', extDir, '--install-extension', vsix],
    { stdio: 'inherit' });
}

// code-server on 127.0.0.1:port with the profile, opening `folder`; its output goes to work/code-server.log.
export async function startCodeServer(codeServer, work, { port, userDir, extDir, folder, env }) {
  const args = [
    '--auth', 'none', '--bind-addr', `127.0.0.1:${port}`, '--disable-telemetry', '--disable-update-check',
    '--disable-workspace-trust', '--config', path.join(work, 'code-server.yaml'), '--user-data-dir', userDir, '--extensions-dir', extDir, folder,
  ];
  const proc = spawn(codeServer, args, { stdio: ['ignore', 'pipe', 'pipe'], env });
  const out = fs.createWriteStream(path.join(work, 'code-server.log'));
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

// Headless Debian Chromium, without the background connections this closed network refuses.
export async function launchBrowser() {
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 720 } });
  page.setDefaultTimeout(60_000);
  return { browser, page };
}

export async function openFile(page, name) {
  await page.keyboard.press('Control+P');
  const input = page.locator('.quick-input-widget input');
  await input.waitFor({ state: 'visible' });
  await input.fill(name);
  await page.locator('.quick-input-list .monaco-list-row', { hasText: name }).first().waitFor({ timeout: 30_000 });
  await page.keyboard.press('Enter');
  await page.locator(`.tab.active[aria-label*="${name}"], .tab.active:has-text("${name}")`).first().waitFor();
  await page.locator('.editor-group-container.active .monaco-editor textarea').first().waitFor({ state: 'attached' });
}

// The newest log file under the profile's logs whose name matches `pattern`: the extension's output
// channels are files there ("specdec.log", with the server's stderr; the LSP trace's).
export function channelFile(userDir, pattern) {
  const logs = path.join(userDir, 'logs');
  if (!fs.existsSync(logs)) return undefined;
  const found = fs.readdirSync(logs, { recursive: true }).map(String).filter((f) => pattern.test(path.basename(f)));
  return found.length ? path.join(logs, found.sort().at(-1)) : undefined;
}
