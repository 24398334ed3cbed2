// Finding the server, in this order:
//   1. `specdec.server.command` if set;
//   2. `specdec.server.pythonPath` if set (run as `python -m speccomplete`);
//   3. the managed environment, once "Set up specdec" has made it (setup.ts finds it; the caller passes it);
//   4. the Python extension's active interpreter (ms-python.python, optional), if it has speccomplete;
//   5. `specdec` on PATH;
//   6. `.venv/bin/specdec` (Windows: `.venv\Scripts\specdec.exe`) in a workspace folder, only in a
//      trusted workspace: running a program that an untrusted folder ships is what trust guards.
// When none is found, `offerInstall` shows an error with "Set up specdec" (makes the managed
// environment, then the server starts) and "Open settings".
import { execFile } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import * as vscode from 'vscode';
import { activeInterpreter } from './pythonExtension';
import { PYTHON_EXTENSION, Server } from './serverSources';

const WINDOWS = process.platform === 'win32';

function hasSpeccomplete(python: string): Promise<boolean> {
  // find_spec does not import it (importing torch takes seconds).
  const code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('speccomplete') is None)";
  return new Promise((resolve) => execFile(python, ['-c', code], { timeout: 20_000 }, (error) => resolve(!error)));
}

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

function onPath(name: string): string | undefined {
  const names = WINDOWS ? [`${name}.exe`, `${name}.cmd`] : [name];
  for (const dir of (process.env.PATH || '').split(path.delimiter)) {
    if (!dir) continue;
    for (const n of names) {
      const candidate = path.join(dir, n);
      if (isExecutable(candidate)) return candidate;
    }
  }
  return undefined;
}

function inWorkspaceVenv(): string | undefined {
  if (!vscode.workspace.isTrusted) return undefined;
  const relative = WINDOWS ? ['.venv', 'Scripts', 'specdec.exe'] : ['.venv', 'bin', 'specdec'];
  for (const folder of vscode.workspace.workspaceFolders ?? []) {
    if (folder.uri.scheme !== 'file') continue;
    const candidate = path.join(folder.uri.fsPath, ...relative);
    if (isExecutable(candidate)) return candidate;
  }
  return undefined;
}

// `managed`: the managed environment's server (setup.ts, managedServer), if it is set up.
export async function findServer(managed: Server | undefined): Promise<Server | undefined> {
  const config = vscode.workspace.getConfiguration('specdec');
  const command = config.get<string>('server.command', '');
  if (command) return { command, args: [], source: 'specdec.server.command' };
  const python = config.get<string>('server.pythonPath', '');
  if (python) return { command: python, args: ['-m', 'speccomplete'], source: 'specdec.server.pythonPath' };
  if (managed) return managed;
  const interpreter = await activeInterpreter();
  if (interpreter && (await hasSpeccomplete(interpreter))) {
    return { command: interpreter, args: ['-m', 'speccomplete'], source: PYTHON_EXTENSION };
  }
  const found = onPath('specdec');
  if (found) return { command: found, args: [], source: 'PATH' };
  const venv = inWorkspaceVenv();
  if (venv) return { command: venv, args: [], source: 'the workspace .venv' };
  return undefined;
}

// The command line for a specdec subcommand; `specdec.server.args` follow the subcommand for `serve`.
export function commandLine(server: Server, subcommand: string[]): { command: string; args: string[] } {
  const extra = subcommand[0] === 'serve' ? vscode.workspace.getConfiguration('specdec').get<string[]>('server.args', []) : [];
  return { command: server.command, args: [...server.args, ...subcommand, ...extra] };
}

export const NOT_FOUND =
  'specdec: the specdec server was not found (not set in specdec.server.command or specdec.server.pythonPath, ' +
  "no managed environment, not in the Python extension's interpreter, not on PATH, not in a workspace .venv). " +
  'Set up specdec makes its own environment in VS Code\'s storage (Python 3.11 or newer, CPU torch: about 1.5 GB on disk).';

export async function offerInstall(): Promise<void> {
  const setUp = 'Set up specdec';
  const settings = 'Open settings';
  const picked = await vscode.window.showErrorMessage(NOT_FOUND, setUp, settings);
  if (picked === settings) {
    await vscode.commands.executeCommand('workbench.action.openSettings', 'specdec.server');
  } else if (picked === setUp) {
    await vscode.commands.executeCommand('specdec.setUpServer');
  }
}
