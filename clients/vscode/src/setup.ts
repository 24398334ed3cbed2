// The managed server environment: a venv in the extension's global storage that the extension makes
// and fills itself ("Set up specdec"), so the server runs without a terminal, a clone or a Python the
// user prepared. A venv also works where the system Python refuses pip (PEP 668, "externally managed").
// Steps: find a Python >= 3.11 with venv, make the venv, install torch (the CPU build unless nvidia-smi
// runs: a bare torch requirement would pull a multi-GB CUDA build on Linux), then the speccomplete
// wheel bundled in the .vsix (dist/server/, built by `npm run package`: speccomplete is not on PyPI).
// A marker file written last says the environment is complete; locate.ts uses it only then.
import { ChildProcess, execFile, spawn } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import * as readline from 'readline';
import * as vscode from 'vscode';
import { Server, activeInterpreter } from './locate';

const WINDOWS = process.platform === 'win32';
// The torch that .ci/setup installs, so the managed server runs what the project tests.
const TORCH = 'torch==2.13.0';
const TORCH_CPU_INDEX = 'https://download.pytorch.org/whl/cpu';
const MARKER = 'specdec-setup.json';
export const MANAGED = 'the managed environment';

let storage: string | undefined; // the extension's global storage folder
let bundled: string | undefined; // the folder holding the bundled wheel
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
    for (const stream of [child.stdout, child.stderr]) {
      if (!stream) continue;
      readline.createInterface({ input: stream, crlfDelay: Infinity }).on('line', (line) => {
        step.output.info(`[setup] ${line}`);
        tail.push(line);
        if (tail.length > 20) tail.shift();
        const shown = /^\s*(Collecting|Downloading|Installing|Processing|Building|Successfully) /.exec(line);
        if (shown) step.progress.report({ message: `${label}: ${line.trim().slice(0, 90)}` });
      });
    }
    child.on('error', (e) => {
      cancel.dispose();
      reject(new Error(`${command}: ${e.message}`));
    });
    child.on('close', (code, signal) => {
      cancel.dispose();
      if (step.token.isCancellationRequested) reject(new Cancelled());
      else if (code === 0) resolve();
      else reject(new Error(`${label} failed (${signal ?? `exit ${code}`}):\n${tail.join('\n')}`));
    });
  });
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

function bundledWheel(): string {
  const wheels = bundled && fs.existsSync(bundled) ? fs.readdirSync(bundled).filter((f) => f.endsWith('.whl')) : [];
  if (!bundled || wheels.length !== 1) {
    throw new Error(`this build of the extension has no speccomplete wheel in ${bundled} (npm run package bundles it)`);
  }
  return path.join(bundled, wheels[0]);
}

async function hasNvidiaGpu(): Promise<boolean> {
  return (await probe('nvidia-smi', ['-L'])) !== undefined;
}

async function setUp(step: Step): Promise<void> {
  const dir = envDir();
  if (!dir) throw new Error('the extension has not been activated');
  const wheel = bundledWheel();
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
  // --no-compile: pip would byte-compile every module of torch and transformers (tens of seconds on a
  // small CPU); Python compiles the ones the server imports on first use instead.
  const pip = [python, '-m', 'pip', 'install', '--no-compile', '--progress-bar', 'off'];
  const gpu = await hasNvidiaGpu();
  step.progress.report({ message: `installing torch (${gpu ? 'CUDA' : 'CPU'})` });
  if (gpu) {
    await run(step, pip[0], [...pip.slice(1), TORCH], 'installing torch');
  } else {
    // Only torch comes from the CPU index, with --no-deps: pip asks the one index for each package it
    // resolves, so its dependencies (sympy, networkx, ...) come with speccomplete's from the usual
    // index below (where the installed torch satisfies `torch>=2.4`). That keeps the CPU index to a
    // single lookup, which also keeps a setup quick where that host is unreachable and only a local
    // wheel (pip's find-links) serves torch: each lookup there costs pip's retries.
    await run(step, pip[0], [...pip.slice(1), '--no-deps', '--index-url', TORCH_CPU_INDEX, TORCH], 'installing torch');
  }
  step.progress.report({ increment: 35 });
  if (step.token.isCancellationRequested) throw new Cancelled();
  // The same version number may hold other code in a newer .vsix: the old one goes first.
  if (reused) await run(step, pip[0], [pip[1], pip[2], 'uninstall', '-y', 'speccomplete'], 'removing the old speccomplete');
  step.progress.report({ message: 'installing speccomplete and its dependencies' });
  await run(step, pip[0], [...pip.slice(1), wheel], 'installing speccomplete');
  step.progress.report({ increment: 55 });
  const specdec = inEnv(dir, 'specdec');
  if (!fs.existsSync(specdec)) throw new Error(`pip finished but ${specdec} is missing`);
  fs.writeFileSync(
    path.join(dir, MARKER),
    JSON.stringify({ wheel: path.basename(wheel), torch: gpu ? 'pypi' : 'cpu', finished: new Date().toISOString() }),
  );
  step.progress.report({ increment: 5 });
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
        try {
          await setUp({ progress, token, output });
          output.info(`[setup] done in ${((Date.now() - started) / 1000).toFixed(1)} s`);
          return true;
        } catch (e) {
          if (e instanceof Cancelled) {
            output.warn('[setup] cancelled');
            return false;
          }
          output.error(`[setup] ${e instanceof Error ? e.message : e}`);
          const log = 'Show log';
          void vscode.window
            .showErrorMessage(`specdec: setting up the server failed: ${e instanceof Error ? e.message.split('\n')[0] : e}`, log)
            .then((picked) => picked === log && output.show());
          return false;
        }
      },
    ),
  ).finally(() => {
    running = undefined;
  });
  return running;
}
