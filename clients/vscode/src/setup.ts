// The managed server environment: a venv in the extension's global storage that the extension makes
// and fills itself ("Set up specdec"), so the server runs without a terminal, a clone or a Python the
// user prepared. A venv also works where the system Python refuses pip (PEP 668, "externally managed").
// Steps: find a Python >= 3.11 with venv, make the venv, install torch (the CPU build unless nvidia-smi
// runs: a bare torch requirement would pull a multi-GB CUDA build on Linux), then the speccomplete
// wheel bundled in the .vsix (dist/server/, built by `npm run package`: speccomplete is not on PyPI).
// A marker file written last says the environment is complete (the managed server is used only then)
// and which wheel it holds, by SHA-256: the version number alone does not tell two builds apart.
// A newer .vsix brings its wheel into the environment after activation, while the installed server
// serves (updateManagedEnvironment); extension.ts then restarts the server between requests.
// One window at a time makes or updates it: a lock file in the global storage (lockFile.ts).
import { ChildProcess, execFile, spawn } from 'child_process';
import { createHash } from 'crypto';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import * as readline from 'readline';
import * as vscode from 'vscode';
import { Lock, heldByAnother, tryLock, waitForLock } from './lockFile';
import { activeInterpreter } from './pythonExtension';
import { MANAGED, Server } from './serverSources';

const WINDOWS = process.platform === 'win32';
// The torch that .ci/setup installs, so the managed server runs what the project tests.
const TORCH = 'torch==2.13.0';
const TORCH_CPU_INDEX = 'https://download.pytorch.org/whl/cpu';
const MARKER = 'specdec-setup.json';
// Beside the environment's folder, not in it: a setup deletes and remakes that folder.
const LOCK = 'server-env.lock';

let storage: string | undefined; // the extension's global storage folder
let bundled: string | undefined; // the folder holding the bundled wheel
let carried: CarriedWheel | undefined; // hashed once
let running: Promise<boolean> | undefined; // one setup at a time in this window

export function initManagedEnvironment(context: vscode.ExtensionContext): void {
  storage = context.globalStorageUri.fsPath;
  bundled = path.join(context.extensionUri.fsPath, 'dist', 'server');
}

function envDir(): string | undefined {
  return storage && path.join(storage, 'server-env');
}

function inEnv(dir: string, name: 'python' | 'specdec'): string {
  return WINDOWS ? path.join(dir, 'Scripts', `${name}.exe`) : path.join(dir, 'bin', name);
}

// The managed environment's server, if a setup finished (its marker is written last).
export function managedServer(): Server | undefined {
  const dir = envDir();
  if (!dir || !fs.existsSync(path.join(dir, MARKER))) return undefined;
  const specdec = inEnv(dir, 'specdec');
  return fs.existsSync(specdec) ? { command: specdec, args: [], source: MANAGED } : undefined;
}

interface CarriedWheel {
  file: string;
  sha256: string;
}

interface Marker {
  wheel: string; // its file name
  sha256?: string; // absent in environments set up before updates came
  torch: 'pypi' | 'cpu';
  finished: string;
}

function readMarker(dir: string): Marker | undefined {
  try {
    return JSON.parse(fs.readFileSync(path.join(dir, MARKER), 'utf8'));
  } catch {
    return undefined;
  }
}

function writeMarker(dir: string, wheel: CarriedWheel, torch: Marker['torch']): void {
  const marker: Marker = { wheel: path.basename(wheel.file), sha256: wheel.sha256, torch, finished: new Date().toISOString() };
  fs.writeFileSync(path.join(dir, MARKER), JSON.stringify(marker));
}

// The wheel this .vsix carries, if it carries one (a build by `npm run build` alone does not).
function carriedWheel(): CarriedWheel | undefined {
  if (carried) return carried;
  const wheels = bundled && fs.existsSync(bundled) ? fs.readdirSync(bundled).filter((f) => f.endsWith('.whl')) : [];
  if (!bundled || wheels.length !== 1) return undefined;
  const file = path.join(bundled, wheels[0]);
  carried = { file, sha256: createHash('sha256').update(fs.readFileSync(file)).digest('hex') };
  return carried;
}

// 'outdated': the environment is set up with another speccomplete than the wheel this .vsix carries.
function installedState(dir: string): 'none' | 'current' | 'outdated' {
  const marker = readMarker(dir);
  if (!marker) return 'none';
  const wheel = carriedWheel();
  return wheel && marker.sha256 !== wheel.sha256 ? 'outdated' : 'current';
}

class Cancelled extends Error {}

interface Step {
  progress: vscode.Progress<{ message?: string; increment?: number }>;
  token: vscode.CancellationToken;
  output: vscode.LogOutputChannel;
}

// Runs a command with its output in the specdec channel and its latest line in the progress
// notification; cancelling the notification ends it.
function run(step: Step, command: string, args: string[], label: string): Promise<void> {
  step.output.info(`[setup] ${command} ${args.join(' ')}`);
  return new Promise((resolve, reject) => {
    const child: ChildProcess = spawn(command, args, {
      env: { ...process.env, PIP_DISABLE_PIP_VERSION_CHECK: '1', PIP_NO_INPUT: '1' },
    });
    const cancel = step.token.onCancellationRequested(() => child.kill());
    const tail: string[] = [];
    // pip says nothing while it unpacks what it downloaded (torch: 6 s here, speccomplete's dependencies 8 s):
    // the notification counts the seconds of its last line, so that it never stands still.
    let shown = label;
    let shownAt = Date.now();
    const ticker = setInterval(() => {
      const quiet = Math.round((Date.now() - shownAt) / 1000);
      if (quiet >= 2) step.progress.report({ message: `${shown} (${quiet} s)` });
    }, 1000);
    for (const stream of [child.stdout, child.stderr]) {
      if (!stream) continue;
      readline.createInterface({ input: stream, crlfDelay: Infinity }).on('line', (line) => {
        step.output.info(`[setup] ${line}`);
        tail.push(line);
        if (tail.length > 20) tail.shift();
        if (/^\s*(Collecting|Downloading|Installing|Processing|Building|Successfully) /.test(line)) {
          shown = `${label}: ${line.trim().slice(0, 90)}`;
          shownAt = Date.now();
          step.progress.report({ message: shown });
        }
      });
    }
    child.on('error', (e) => {
      clearInterval(ticker);
      cancel.dispose();
      reject(new Error(`${command}: ${e.message}`));
    });
    child.on('close', (code, signal) => {
      clearInterval(ticker);
      cancel.dispose();
      if (step.token.isCancellationRequested) reject(new Cancelled());
      else if (code === 0) resolve();
      else reject(new Error(`${label} failed (${signal ?? `exit ${code}`}):\n${tail.join('\n')}`));
    });
  });
}

// Python compiles a module at its first import (--no-compile below), and a first server start imports some
// 2,000: seconds of a 2-core machine's start. compile_ahead.py (carried beside the wheel) compiles them as pip
// puts them in, on the core pip leaves idle, at a lower priority; it stops once speccomplete is installed.
// Not waited for: what it has not compiled when the server starts, the server compiles. The caller stops it
// where pip fails.
function compileAheadInBackground(step: Step, python: string): ChildProcess | undefined {
  const script = bundled && path.join(bundled, 'compile_ahead.py');
  if (!script || !fs.existsSync(script)) {
    step.output.info(`[setup] compile ahead: ${script ?? 'compile_ahead.py'} is missing; the server compiles its modules`);
    return undefined;
  }
  const child = spawn(python, [script], { stdio: ['ignore', 'pipe', 'pipe'] });
  // where Python has no os.nice (Windows), its priority is lowered from here
  if (WINDOWS && child.pid !== undefined) {
    try {
      os.setPriority(child.pid, os.constants.priority.PRIORITY_BELOW_NORMAL);
    } catch {
      // at the normal priority then
    }
  }
  const cancel = step.token.onCancellationRequested(() => child.kill());
  const said: string[] = [];
  child.stdout.on('data', (chunk: Buffer) => said.push(chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => said.push(chunk.toString()));
  child.on('error', (e) => {
    cancel.dispose();
    step.output.info(`[setup] compiling ahead: ${e.message}`);
  });
  child.on('close', (code, signal) => {
    cancel.dispose();
    step.output.info(`[setup] compile ahead (exit ${signal ?? code}): ${said.join('').trim()}`);
  });
  return child;
}

function probe(command: string, args: string[]): Promise<string | undefined> {
  return new Promise((resolve) =>
    execFile(command, args, { timeout: 20_000 }, (error, stdout) => resolve(error ? undefined : stdout.trim())),
  );
}

// A Python >= 3.11 that can make a venv (Debian and Ubuntu ship venv's ensurepip separately, in
// python3-venv). Tries the Python extension's interpreter first, then the usual names.
async function findPython(output: vscode.LogOutputChannel): Promise<{ command: string; args: string[] }> {
  const code =
    'import sys, importlib.util as u; ' +
    "print(sys.version_info[0], sys.version_info[1], int(bool(u.find_spec('venv') and u.find_spec('ensurepip'))))";
  const candidates: string[][] = [];
  const interpreter = await activeInterpreter();
  if (interpreter) candidates.push([interpreter]);
  if (WINDOWS) candidates.push(['py', '-3'], ['python'], ['python3']);
  else candidates.push(['python3'], ['python'], ...['3.13', '3.12', '3.11'].map((v) => [`python${v}`]));
  const refused: string[] = [];
  for (const [command, ...args] of candidates) {
    const answer = await probe(command, [...args, '-c', code]);
    if (!answer) continue;
    const [major, minor, venv] = answer.split(' ').map(Number);
    const name = [command, ...args].join(' ');
    if (major < 3 || (major === 3 && minor < 11)) refused.push(`${name} is ${major}.${minor}`);
    else if (!venv) refused.push(`${name} (${major}.${minor}) has no venv module (Debian, Ubuntu: apt install python3-venv)`);
    else {
      output.info(`[setup] Python: ${name} (${major}.${minor})`);
      return { command, args };
    }
  }
  throw new Error(
    `no Python 3.11 or newer with venv was found${refused.length ? `: ${refused.join('; ')}` : ' (tried python3 and python)'}. ` +
      'Install one, or set specdec.server.pythonPath to an interpreter that has speccomplete.',
  );
}

async function hasNvidiaGpu(): Promise<boolean> {
  return (await probe('nvidia-smi', ['-L'])) !== undefined;
}

// --no-compile: pip would byte-compile every module of torch and transformers (tens of seconds on a
// small CPU); Python compiles the ones the server imports on first use instead.
function pipInstall(python: string): string[] {
  return [python, '-m', 'pip', 'install', '--no-compile', '--progress-bar', 'off'];
}

// speccomplete from the carried wheel. `replacing`: one is installed already. The plain install
// brings the wheel's new dependencies (and a higher version), but keeps an installed one of the same
// version, which a newer .vsix may carry with other code: the second install puts the wheel's files
// in, --no-deps so that torch and the rest stay. pip puts the old files back when an install fails,
// so a failed update leaves the installed server as it was.
async function installSpeccomplete(step: Step, python: string, wheel: string, replacing: boolean): Promise<void> {
  const pip = pipInstall(python);
  step.progress.report({ message: 'installing speccomplete and its dependencies' });
  await run(step, pip[0], [...pip.slice(1), wheel], 'installing speccomplete');
  if (!replacing) return;
  step.progress.report({ message: "replacing the installed speccomplete with this extension's" });
  await run(step, pip[0], [...pip.slice(1), '--force-reinstall', '--no-deps', wheel], 'replacing speccomplete');
}

async function setUp(step: Step, dir: string): Promise<void> {
  const wheel = carriedWheel();
  if (!wheel) throw new Error(`this build of the extension has no speccomplete wheel in ${bundled} (npm run package bundles it)`);
  fs.rmSync(path.join(dir, MARKER), { force: true });
  const python = inEnv(dir, 'python');
  // A venv whose Python still runs is kept (a repair then reinstalls only what is missing); one whose
  // base Python went (an upgraded system Python) is made again.
  const reused = fs.existsSync(python) && (await probe(python, ['-c', 'pass'])) !== undefined;
  if (!reused) {
    step.progress.report({ message: 'finding Python' });
    const base = await findPython(step.output);
    fs.rmSync(dir, { recursive: true, force: true });
    fs.mkdirSync(path.dirname(dir), { recursive: true });
    step.progress.report({ message: 'creating the environment' });
    await run(step, base.command, [...base.args, '-m', 'venv', dir], 'creating the environment');
  }
  step.progress.report({ increment: 5 });
  if (step.token.isCancellationRequested) throw new Cancelled();
  const pip = pipInstall(python);
  const gpu = await hasNvidiaGpu();
  step.progress.report({ message: `installing torch (${gpu ? 'CUDA' : 'CPU'})` });
  if (gpu) {
    await run(step, pip[0], [...pip.slice(1), TORCH], 'installing torch');
  } else {
    // Only torch comes from the CPU index, with --no-deps: pip asks the one index for each package it
    // resolves, so its dependencies (sympy, networkx, ...) come with speccomplete's from the usual
    // index below (where the installed torch satisfies `torch>=2.4`). That keeps the CPU index to a
    // single lookup, with one retry (as Neovim's :SpecdecInstall; the timeout is pip's default), which
    // keeps a setup quick where that host is unreachable and only a local wheel (pip's find-links or
    // mirror) serves torch: pip's default five retries there cost 8 s.
    await run(
      step,
      pip[0],
      [...pip.slice(1), '--retries', '1', '--timeout', '15', '--no-deps', '--index-url', TORCH_CPU_INDEX, TORCH],
      'installing torch',
    );
  }
  step.progress.report({ increment: 35 });
  if (step.token.isCancellationRequested) throw new Cancelled();
  const compiling = compileAheadInBackground(step, python);
  try {
    await installSpeccomplete(step, python, wheel.file, reused);
  } catch (e) {
    compiling?.kill(); // no speccomplete to wait for
    throw e;
  }
  step.progress.report({ increment: 55 });
  const specdec = inEnv(dir, 'specdec');
  if (!fs.existsSync(specdec)) throw new Error(`pip finished but ${specdec} is missing`);
  writeMarker(dir, wheel, gpu ? 'pypi' : 'cpu');
  step.progress.report({ increment: 5 });
}

const WAITING_FOR_OTHER_WINDOW = '[setup] another VS Code window is setting up or updating the server environment; waiting for it';

function showFailure(output: vscode.LogOutputChannel, message: string): void {
  const log = 'Show log';
  void vscode.window.showErrorMessage(message, log).then((picked) => picked === log && output.show());
}

// The gist of an error for a notification: run()'s errors go on with pip's last lines, for the log.
function firstLine(e: unknown): string {
  return e instanceof Error ? e.message.split('\n')[0].replace(/:$/, '') : String(e);
}

// Whether updateManagedEnvironment may have anything to do: the environment holds another wheel than
// the one this .vsix carries, or another window holds the lock (setting it up or updating it). The
// usual case, a marker read and the wheel's hash, is false: nothing to install and no one to wait for.
export function managedUpdateDue(): boolean {
  const dir = envDir();
  return !!dir && (installedState(dir) === 'outdated' || anotherWindowSettingUp());
}

// What the managed environment holds, as its marker says (undefined: not set up). The marker is written
// last, by each setup and update: when it changed, a running managed server runs replaced files.
export function managedEnvironmentStamp(): string | undefined {
  const dir = envDir();
  try {
    return dir ? fs.readFileSync(path.join(dir, MARKER), 'utf8') : undefined;
  } catch {
    return undefined;
  }
}

// Whether another window holds the lock: it is making or updating the environment now.
export function anotherWindowSettingUp(): boolean {
  return !!storage && heldByAnother(path.join(storage, LOCK));
}

// Another window holds the lock: waits for it with a progress in the status bar, not a notification,
// since this window's server (the one installed) is not waiting for it.
function waitForOtherWindow(output: vscode.LogOutputChannel, lockFile: string, cancelled: () => boolean): Promise<Lock | undefined> {
  output.info(WAITING_FOR_OTHER_WINDOW);
  return Promise.resolve(
    vscode.window.withProgress(
      { location: vscode.ProgressLocation.Window, title: 'specdec: waiting for another window to set up the server' },
      () => waitForLock(lockFile, cancelled),
    ),
  );
}

// Installs the carried wheel into the set-up environment, then records it in the marker. pip replaces
// speccomplete's files under the running server; a failed install puts the old ones back and leaves
// the marker as it was, so the next window to open tries again.
async function installCarriedWheel(output: vscode.LogOutputChannel, dir: string): Promise<void> {
  const wheel = carriedWheel()!;
  const installed = readMarker(dir);
  output.info(
    `[setup] the server environment holds ${installed?.wheel} (sha256 ${installed?.sha256 ?? 'not recorded'}), ` +
      `this extension carries ${path.basename(wheel.file)} (sha256 ${wheel.sha256}): installing it while the installed server runs`,
  );
  const started = Date.now();
  await vscode.window.withProgress(
    { location: vscode.ProgressLocation.Notification, title: 'specdec: updating the server to this version of the extension' },
    async (progress, token) => {
      await installSpeccomplete({ progress, token, output }, inEnv(dir, 'python'), wheel.file, true);
      writeMarker(dir, wheel, installed?.torch ?? 'cpu');
    },
  );
  output.info(`[setup] updated in ${((Date.now() - started) / 1000).toFixed(1)} s`);
}

// In the background, while the server installed serves: waits while another window makes or updates
// the managed environment, then, when it holds another speccomplete than the wheel this .vsix carries,
// installs the carried one (speccomplete alone: torch and the other dependencies stay). The caller
// restarts the server when the environment changed (managedEnvironmentStamp). `cancelled`: the window
// is closing. On a failure the installed server stays; this never throws.
export async function updateManagedEnvironment(output: vscode.LogOutputChannel, cancelled: () => boolean): Promise<void> {
  const dir = envDir();
  if (!dir || !storage || !managedUpdateDue()) return;
  const lockFile = path.join(storage, LOCK);
  let lock: Lock | undefined;
  try {
    lock = tryLock(lockFile) ?? (await waitForOtherWindow(output, lockFile, cancelled));
    if (!lock) return; // the window is closing
    // Still outdated: not brought up to date by the window waited for.
    if (installedState(dir) === 'outdated') await installCarriedWheel(output, dir);
  } catch (e) {
    output.error(`[setup] updating the server environment: ${e instanceof Error ? e.message : e}`);
    const kept = managedServer() ? ' The installed server keeps running; the next window to open tries again.' : '';
    showFailure(output, `specdec: updating the server failed: ${firstLine(e)}.${kept}`);
  } finally {
    lock?.release();
  }
}

// "Set up specdec": makes (or repairs) the managed environment with a cancellable progress
// notification; true when it is ready. The caller starts the server.
export function setUpServerEnvironment(output: vscode.LogOutputChannel): Promise<boolean> {
  if (running) return running;
  const started = Date.now();
  running = Promise.resolve(
    vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: 'specdec: setting up the server', cancellable: true },
      async (progress, token) => {
        output.info(`[setup] the server environment in ${envDir()}`);
        let lock: Lock | undefined;
        try {
          const dir = envDir();
          if (!dir || !storage) throw new Error('the extension has not been activated');
          const lockFile = path.join(storage, LOCK);
          lock = tryLock(lockFile);
          if (!lock) {
            output.info(WAITING_FOR_OTHER_WINDOW);
            progress.report({ message: 'waiting for another VS Code window that is setting it up' });
            lock = await waitForLock(lockFile, () => token.isCancellationRequested);
            if (!lock) throw new Cancelled();
            // The window waited for made what this one was about to make: use it.
            if (installedState(dir) === 'current' && managedServer()) {
              output.info('[setup] ready: set up or updated while this setup waited');
              return true;
            }
          }
          await setUp({ progress, token, output }, dir);
          output.info(`[setup] done in ${((Date.now() - started) / 1000).toFixed(1)} s`);
          return true;
        } catch (e) {
          if (e instanceof Cancelled) {
            output.warn('[setup] cancelled');
            return false;
          }
          output.error(`[setup] ${e instanceof Error ? e.message : e}`);
          showFailure(output, `specdec: setting up the server failed: ${firstLine(e)}`);
          return false;
        } finally {
          lock?.release();
        }
      },
    ),
  ).finally(() => {
    running = undefined;
  });
  return running;
}
