// VS Code client for the specdec language server: starts `specdec serve` over stdio, shows the
// server's state in the status bar, and adds commands to toggle completions, restart the server
// and open the telemetry report. Inline completion itself is vscode-languageclient's own feature;
// the item's `command` (specdec.accept) is registered by the client from the server's
// executeCommandProvider, so acceptance reaches the server's telemetry without code here.
import * as vscode from 'vscode';
import { LanguageClient, LanguageClientOptions, ServerOptions } from 'vscode-languageclient/node';
import { openTelemetryReport } from './report';
import { commandChanged, initializationOptions, optionsChanged, serverCommand } from './settings';
import { SpecdecStatus, StatusBar } from './statusBar';

let client: LanguageClient | undefined;
// The options the running server has: sent at initialize, then by didChangeConfiguration.
let sentOptions: Record<string, unknown> = {};
let statusBar: StatusBar;
let output: vscode.LogOutputChannel;

function completionsEnabled(): boolean {
  return vscode.workspace.getConfiguration('specdec').get<boolean>('enable', true);
}

function createClient(): LanguageClient {
  const { command, args } = serverCommand(['serve']);
  sentOptions = initializationOptions();
  // No `transport`: with TransportKind.stdio the client would append --stdio to the arguments;
  // plain pipes are stdio already.
  const serverOptions: ServerOptions = { command, args };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
    initializationOptions: sentOptions,
    outputChannel: output,
    middleware: {
      provideInlineCompletionItems: (document, position, context, token, next) =>
        completionsEnabled() ? next(document, position, context, token) : undefined,
      // The server's textDocument/completion is the fallback for editors without inline
      // completion; in VS Code it would only duplicate the ghost text in the suggest widget.
      provideCompletionItem: () => undefined,
    },
  };
  const c = new LanguageClient('specdec', 'specdec', serverOptions, clientOptions);
  c.onNotification('specdec/status', (status: SpecdecStatus) => statusBar.update(status));
  c.onDidChangeState((e) => {
    // State 1 is Stopped: the process died or was stopped.
    if (e.newState === 1) statusBar.update({ state: 'error', message: 'server stopped', acceptance: null, p50_ms: null });
  });
  return c;
}

async function startServer(): Promise<void> {
  statusBar.update({ state: 'loading', message: 'starting server', acceptance: null, p50_ms: null });
  client = createClient();
  try {
    await client.start();
  } catch (e) {
    statusBar.update({ state: 'error', message: `could not start server: ${e}`, acceptance: null, p50_ms: null });
    output.error(`could not start specdec server: ${e}`);
  }
}

async function restartServer(): Promise<void> {
  const old = client;
  client = undefined;
  if (old) {
    try {
      await old.stop();
    } catch (e) {
      output.warn(`stopping the server: ${e}`);
    }
  }
  await startServer();
}

// The server applies new settings in place (reloading the models only when the model settings
// change). A setting that went back to unset has no value to send, so only a restart restores
// the server's default for it.
async function updateOptions(): Promise<void> {
  const options = initializationOptions();
  const unset = Object.keys(sentOptions).filter((key) => !(key in options));
  if (unset.length > 0 || !client?.isRunning()) {
    await restartServer();
    return;
  }
  sentOptions = options;
  await client.sendNotification('workspace/didChangeConfiguration', { settings: { specdec: options } });
}

async function setEnabled(enabled: boolean): Promise<void> {
  await vscode.workspace.getConfiguration('specdec').update('enable', enabled, vscode.ConfigurationTarget.Global);
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  output = vscode.window.createOutputChannel('specdec', { log: true });
  statusBar = new StatusBar(completionsEnabled());
  context.subscriptions.push(
    output,
    statusBar,
    vscode.commands.registerCommand('specdec.enableCompletions', () => setEnabled(true)),
    vscode.commands.registerCommand('specdec.disableCompletions', () => setEnabled(false)),
    vscode.commands.registerCommand('specdec.restartServer', restartServer),
    vscode.commands.registerCommand('specdec.openTelemetryReport', () => openTelemetryReport(output)),
    vscode.commands.registerCommand('specdec.showMenu', showMenu),
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (e.affectsConfiguration('specdec.enable')) statusBar.setEnabled(completionsEnabled());
      if (commandChanged(e)) await restartServer();
      else if (optionsChanged(e)) await updateOptions();
    }),
  );
  await startServer();
}

export async function deactivate(): Promise<void> {
  await client?.stop();
}

async function showMenu(): Promise<void> {
  const toggle = completionsEnabled()
    ? { label: 'Disable completions', command: 'specdec.disableCompletions' }
    : { label: 'Enable completions', command: 'specdec.enableCompletions' };
  const picked = await vscode.window.showQuickPick(
    [
      toggle,
      { label: 'Restart server', command: 'specdec.restartServer' },
      { label: 'Open telemetry report', command: 'specdec.openTelemetryReport' },
      { label: 'Show server log', command: 'specdec.showLog' },
    ],
    { title: `specdec: ${statusBar.describe()}` },
  );
  if (!picked) return;
  if (picked.command === 'specdec.showLog') output.show();
  else await vscode.commands.executeCommand(picked.command);
}
