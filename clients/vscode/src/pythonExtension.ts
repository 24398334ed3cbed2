// The Python extension (ms-python.python, optional): its active interpreter, where locate.ts looks for
// speccomplete and setup.ts first looks for a Python to make the managed environment with.
import * as vscode from 'vscode';

// The parts of the Python extension's API used here (its `environments` API, 2023 and later).
interface PythonApi {
  environments?: {
    getActiveEnvironmentPath(resource?: vscode.Uri): { id: string; path: string } | undefined;
    resolveEnvironment(
      env: { id: string; path: string } | string,
    ): Promise<{ executable?: { uri?: vscode.Uri } } | undefined>;
    onDidChangeActiveEnvironmentPath?: vscode.Event<unknown>;
  };
}

let interpreterListener: (() => void) | undefined;
let watching: vscode.Disposable | undefined;

// Called when the Python extension's active interpreter changes, once the search has consulted it
// (the Python extension is not activated just for this).
export function onInterpreterChange(listener: () => void): vscode.Disposable {
  interpreterListener = listener;
  return new vscode.Disposable(() => {
    interpreterListener = undefined;
    watching?.dispose();
    watching = undefined;
  });
}

async function pythonApi(): Promise<PythonApi | undefined> {
  const ext = vscode.extensions.getExtension<PythonApi>('ms-python.python');
  if (!ext) return undefined;
  try {
    const api = ext.isActive ? ext.exports : await ext.activate();
    const event = api?.environments?.onDidChangeActiveEnvironmentPath;
    if (!watching && event) watching = event(() => interpreterListener?.());
    return api;
  } catch {
    return undefined;
  }
}

// The Python extension's active interpreter for the first workspace folder, if it is installed.
export async function activeInterpreter(): Promise<string | undefined> {
  const environments = (await pythonApi())?.environments;
  if (!environments) return undefined;
  try {
    const active = environments.getActiveEnvironmentPath(vscode.workspace.workspaceFolders?.[0]?.uri);
    if (!active) return undefined;
    const resolved = await environments.resolveEnvironment(active);
    return resolved?.executable?.uri?.fsPath ?? active.path;
  } catch {
    return undefined;
  }
}
