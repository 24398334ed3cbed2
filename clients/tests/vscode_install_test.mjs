// VS Code first-run test (issue 43, "found and installed without a terminal"): code-server with the
// packaged extension in a clean profile (fresh user data, extensions and global storage), a project
// folder that is not the clone and has no .venv, a fresh HOME (so no specdec and no pyenv on the PATH
// that VS Code resolves from the login shell: only the system Python, on Debian an externally-managed
// one, PEP 668; and cold caches: pip's, the GGUF package's), a fresh SPECDEC_CACHE (the model's GGUF is
// converted cold). The extension finds no server and offers "Set up specdec"; the test
// clicks it, which makes the managed environment in the extension's global storage and starts the
// server, then types a mid-line prefix in a Python file and waits for ghost text to come by itself.
// The seconds from the click to the ghost text, and their parts (venv, pip's two installs, server start
// to ready: mostly the GGUF conversion, ready to ghost text: the typing and the first completion), go
// to $WORK/install.json. Everything else is at VS Code's and specdec's defaults.
//
// Environment: CODE_SERVER, VSIX, WORK (an empty temp folder; failure.png and the logs land there),
// SCREENSHOT_DIR (optional: vscode-setup-progress.png, the setup's progress notification, and
// vscode-setup-ghost-text.png, the first ghost text), TIMEOUT_MS (optional: the longest wait for the
// setup and the model load together).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  GHOST, QUIET_WORKBENCH, SUGGEST_WIDGET, channelFile, freePort, installExtension, launchBrowser, openFile, plain, requireEnv,
  startCodeServer, writeSettings,
} from './code_server.mjs';

const CODE_SERVER = requireEnv('CODE_SERVER');
const VSIX = requireEnv('VSIX');
const WORK = requireEnv('WORK');
const SCREENSHOT_DIR = process.env.SCREENSHOT_DIR;
const TIMEOUT_MS = Number(process.env.TIMEOUT_MS || 900_000);
// The file typed in: the prefix ends mid-line, where the model has something to add.
const FILE = { name: 'greet.py', context: 'import sys\n\n\ndef greet(name):\n    ', typed: 'message = "Hello, " + ', after: '\n    print(message)\n' };
const KEY_DELAY_MS = 80;
// How long one typing of the prefix waits for ghost text before it is typed again (a new request).
const GHOST_WAIT_MS = 30_000;
const GHOST_TRIES = 3;

const log = (msg) => console.error(`[vscode-install] ${msg}`);

// PATH as a new user has it: no folder with a specdec in it, and no pyenv (the Python found is the
// system's, which on Debian is externally managed). VS Code also reads the login shell's environment,
// which the fresh HOME keeps to the system's profile.
function userPath() {
  return process.env.PATH.split(path.delimiter)
    .filter((d) => d && !d.includes('.pyenv') && !fs.existsSync(path.join(d, 'specdec')))
    .join(path.delimiter);
}

// code-server's environment: a fresh HOME, a user's PATH, a cold model cache and no caches of this machine.
function userEnv() {
  const home = path.join(WORK, 'home');
  fs.mkdirSync(home, { recursive: true });
  const childEnv = {
    ...process.env,
    HOME: home,
    PATH: userPath(),
    SPECDEC_CACHE: path.join(WORK, 'specdec-cache'), // cold: the GGUF is converted on first use
  };
  for (const name of ['XDG_CACHE_HOME', 'XDG_CONFIG_HOME', 'XDG_DATA_HOME', 'PIP_CACHE_DIR']) delete childEnv[name];
  return childEnv;
}

// The "specdec" output channel's log file (with VS Code's timestamps).
const specdecChannel = () => channelFile(path.join(WORK, 'user'), /^specdec\.log$/);

function saveLogs() {
  const file = specdecChannel();
  if (file) fs.copyFileSync(file, path.join(WORK, 'specdec-channel.log'));
}

// The epoch ms of the first channel line matching `pattern` ("2026-11-27 18:42:01.123 [info] ..."; the
// log's times are local, as Date reads them).
function loggedAt(lines, pattern) {
  const line = lines.find((l) => pattern.test(l));
  const m = line && /^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d\.\d{3})/.exec(line);
  return m ? new Date(`${m[1]}T${m[2]}`).getTime() : null;
}

function pythonInfo(python) {
  const code = 'import sys, sysconfig, os; print(sys.version.split()[0], os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))';
  const [version, managed] = execFileSync(python, ['-c', code], { encoding: 'utf8' }).trim().split(' ');
  return { version, externallyManaged: managed === 'True' };
}

const seconds = (from, to) => (from === null || to === null ? null : Number(((to - from) / 1000).toFixed(1)));

// What the user sees of the wait, sampled every 250 ms until stop(): the text of specdec's notifications and
// its status bar item together. The longest stretch in which none of it changed, and what it showed then.
function watchStill(page) {
  let shown = null;
  let since = Date.now();
  let running = true;
  const longest = { s: 0, showing: '' };
  const account = (now) => {
    const still = (now - since) / 1000;
    if (shown !== null && still > longest.s) Object.assign(longest, { s: Number(still.toFixed(1)), showing: shown });
  };
  const sampling = (async () => {
    while (running) {
      const texts = await page
        .locator('.notification-toast, .statusbar-item')
        .filter({ hasText: 'specdec' })
        .allInnerTexts()
        .catch(() => null);
      if (texts !== null) {
        const now = plain(texts.join(' | '));
        if (now !== shown) {
          account(Date.now());
          shown = now;
          since = Date.now();
        }
      }
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  })();
  return {
    async stop() {
      running = false;
      await sampling;
      account(Date.now());
      return longest;
    },
  };
}

async function main() {
  const userDir = path.join(WORK, 'user');
  const extDir = path.join(WORK, 'extensions');
  const folder = path.join(WORK, 'project');
  fs.mkdirSync(folder, { recursive: true });
  fs.writeFileSync(path.join(folder, FILE.name), FILE.context + FILE.after);
  writeSettings(userDir, { User: QUIET_WORKBENCH }); // no specdec setting at all
  log('installing the extension');
  installExtension(CODE_SERVER, WORK, userDir, extDir, VSIX);

  const port = await freePort();
  const server = await startCodeServer(CODE_SERVER, WORK, { port, userDir, extDir, folder, env: userEnv() });
  const { browser, page } = await launchBrowser();
  let failed = false;
  try {
    await page.goto(`http://127.0.0.1:${port}/?folder=${encodeURIComponent(folder)}`);
    await page.locator('.monaco-workbench').waitFor({ timeout: 120_000 });
    const button = page.locator('.notification-toast .monaco-button', { hasText: 'Set up specdec' }).first();
    await button.waitFor({ timeout: 120_000 });
    const notFound = plain(await page.locator('.notification-toast', { hasText: 'Set up specdec' }).first().innerText());
    log(`not found: ${JSON.stringify(notFound)}`);
    await button.click();
    const clicked = Date.now();
    const still = watchStill(page);
    log('clicked "Set up specdec"');
    // The machine's 1-minute load average while it runs: other work on a small CPU stretches every part.
    const loads = [os.loadavg()[0]];
    const sampler = setInterval(() => loads.push(os.loadavg()[0]), 5000);

    // The progress notification, once pip is installing (the first minutes of a new user's wait).
    const progress = page.locator('.notification-toast', { hasText: 'setting up the server' }).first();
    await progress.waitFor({ timeout: 60_000 });
    await page.locator('.notification-toast', { hasText: /installing (torch|speccomplete)/ }).first().waitFor({ timeout: 300_000 });
    const progressText = plain(await progress.innerText());
    log(`progress: ${JSON.stringify(progressText)}`);
    await page.mouse.move(640, 300); // away from the button the click left a hover on
    if (SCREENSHOT_DIR) await page.screenshot({ path: path.join(SCREENSHOT_DIR, 'vscode-setup-progress.png') });

    const status = page.locator('.statusbar-item', { hasText: 'specdec' }).first();
    const deadline = clicked + TIMEOUT_MS;
    // Ready: the check icon; an error icon after the click means the setup or the server failed.
    for (;;) {
      if (await status.locator('.codicon-check').count()) break;
      const text = plain(await status.innerText().catch(() => ''));
      if (Date.now() > deadline) throw new Error(`the server was not ready ${TIMEOUT_MS} ms after the click: ${text}`);
      if (await page.locator('.notification-toast', { hasText: 'setting up the server failed' }).count()) {
        throw new Error('the setup failed (see specdec-channel.log)');
      }
      await page.waitForTimeout(250);
    }
    const ready = Date.now();
    const longestStill = await still.stop();
    log(`server ready ${seconds(clicked, ready)} s after the click: ${plain(await status.innerText())}`);
    log(`the longest the setup's notification and the status bar stood still: ${JSON.stringify(longestStill)}`);

    await openFile(page, FILE.name);
    await page.locator('.editor-group-container.active .monaco-editor .view-lines').first().click();
    await page.keyboard.press('Control+Home');
    for (let i = 0; i < FILE.context.split('\n').length - 1; i++) await page.keyboard.press('ArrowDown');
    await page.keyboard.press('End');
    let ghost = null;
    for (let attempt = 1; attempt <= GHOST_TRIES && ghost === null; attempt++) {
      if (attempt > 1) {
        // Nothing came: a new request at the same place (the last key typed again).
        if (await page.locator(SUGGEST_WIDGET).count()) await page.keyboard.press('Escape');
        await page.keyboard.press('Backspace');
        await page.keyboard.type(FILE.typed.at(-1), { delay: KEY_DELAY_MS });
      } else {
        await page.keyboard.type(FILE.typed, { delay: KEY_DELAY_MS });
      }
      try {
        await page.locator(GHOST).filter({ hasText: /\S/ }).first().waitFor({ state: 'visible', timeout: GHOST_WAIT_MS });
        ghost = { text: plain((await page.locator(GHOST).allInnerTexts()).join('')), at: Date.now(), attempt };
      } catch {
        log(`try ${attempt}: no ghost text in ${GHOST_WAIT_MS} ms`);
      }
    }
    if (ghost === null) throw new Error(`no ghost text after ${GHOST_TRIES} tries`);
    clearInterval(sampler);
    log(`ghost text ${JSON.stringify(ghost.text)}, ${seconds(clicked, ghost.at)} s after the click`);
    await page.waitForTimeout(300); // the rest of a multi-part ghost text
    if (SCREENSHOT_DIR) await page.screenshot({ path: path.join(SCREENSHOT_DIR, 'vscode-setup-ghost-text.png') });

    saveLogs();
    const lines = fs.readFileSync(specdecChannel() ?? '/dev/null', 'utf8').split('\n');
    const found = /found through ([^)]*)\)/.exec(lines.find((l) => l.includes('found through')) ?? '')?.[1] ?? null;
    // what the setup compiled beside pip (clients/setup/compile_ahead.py): "compile ahead (exit 0): compiled N of the M files"
    const ahead = /\[setup\] compile ahead \(exit (\S+)\): compiled (\d+) of the (\d+) files/.exec(
      lines.find((l) => l.includes('[setup] compile ahead')) ?? '',
    );
    const at = {
      venv: loggedAt(lines, /\[setup\] .* -m venv /),
      torch: loggedAt(lines, /\[setup\] .* -m pip install .*torch==/),
      speccomplete: loggedAt(lines, /\[setup\] .* -m pip install .*\.whl$/),
      done: loggedAt(lines, /\[setup\] done in /),
      serverStart: loggedAt(lines, /starting .* serve/),
    };
    const storage = path.join(userDir, 'User', 'globalStorage', 'specdec.specdec-vscode', 'server-env');
    const sitePackages = fs.readdirSync(path.join(storage, 'lib')).map((d) => path.join(storage, 'lib', d, 'site-packages'));
    const torch = sitePackages.flatMap((d) => fs.readdirSync(d)).find((d) => /^torch-.*\.dist-info$/.test(d)) ?? null;
    // The Python the extension made the venv with, and whether it is externally managed (PEP 668).
    const base = /^executable = (.*)$/m.exec(fs.readFileSync(path.join(storage, 'pyvenv.cfg'), 'utf8'))?.[1] ?? null;
    const baseInfo = base ? pythonInfo(base) : null;
    const result = {
      clickToGhostS: seconds(clicked, ghost.at),
      parts: {
        venvS: seconds(at.venv, at.torch),
        pipTorchS: seconds(at.torch, at.speccomplete),
        pipSpeccompleteS: seconds(at.speccomplete, at.done),
        serverStartToReadyS: seconds(at.serverStart, ready), // mostly the GGUF conversion (cold SPECDEC_CACHE)
        readyToGhostS: seconds(ready, ghost.at), // opening the file, typing the prefix, the first completion
        clickToSetupStartS: seconds(clicked, at.venv),
        setupDoneToServerStartS: seconds(at.done, at.serverStart),
      },
      load: { cpus: os.cpus().length, mean: Number((loads.reduce((a, b) => a + b, 0) / loads.length).toFixed(2)), max: Math.max(...loads) },
      ghost: ghost.text,
      ghostTries: ghost.attempt,
      found,
      torch,
      environment: storage,
      markerWritten: fs.existsSync(path.join(storage, 'specdec-setup.json')),
      python: { path: base, ...baseInfo },
      notFound,
      progress: progressText,
      // from the click to ready, the longest that specdec's notifications and status bar item showed the same text
      longestStillS: longestStill.s,
      stillShowing: longestStill.showing,
      compiledAhead: ahead ? { exit: ahead[1], compiled: Number(ahead[2]), listed: Number(ahead[3]) } : null,
    };
    fs.writeFileSync(path.join(WORK, 'install.json'), JSON.stringify(result, null, 2));
    log(`result: ${JSON.stringify(result, null, 2)}`);
  } catch (e) {
    failed = true;
    log(`FAIL: ${e.stack || e}`);
    await page.screenshot({ path: path.join(WORK, 'failure.png') }).catch(() => {});
    saveLogs();
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
