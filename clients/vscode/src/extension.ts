// VS Code client for the specdec language server: finds and starts `specdec serve` over stdio, shows
// the server's state in the status bar, and adds commands to toggle, snooze and trigger completions,
// restart the server and open the telemetry report. Inline completion itself is vscode-languageclient's
// own feature; the middleware below decides which requests reach the server (gating.ts), times what
// the user waits for an answer, and says why an explicitly asked-for one was empty (statusBar.ts). The
// item's `command` (specdec.accept) is registered by the client from the server's executeCommandProvider,
// so acceptance reaches the server's telemetry without code here.
import { performance } from 'perf_hooks';
import * as vscode from 'vscode';
import { LanguageClient, LanguageClientOptions, Middleware, ServerOptions, State } from 'vscode-languageclient/node';
import {
  Snooze,
  globallyEnabled,
  languageEnabled,
  mode,
  setGloballyEnabled,
  setLanguageEnabled,
} from './gating';
import { commandLine, findServer, offerInstall } from './locate';
import { TraceChannel, pipeStderr } from './logs';
import { onInterpreterChange } from './pythonExtension';
import { MANAGED, PYTHON_EXTENSION, Server } from './serverSources';
import { InFlight } from './inFlight';
import {
  anotherWindowSettingUp,
  initManagedEnvironment,
  managedEnvironmentStamp,
  managedServer,
  managedUpdateDue,
  setUpServerEnvironment,
  updateManagedEnvironment,
} from './setup';
import { openTelemetryReport } from './report';
import {
  commandChanged,
  initializationOptions,
  inlineSuggestOff,
  offerInlineSuggest,
  optionsChanged,
  turnOnInlineSuggest,
} from './settings';
import { Completed, CompletedNotes, Gate, SpecdecStatus, StatusBar, reasonWords, WaitClock } from './statusBar';

let client: LanguageClient | undefined;
let server: Server | undefined; // how the running server was found
// The options the running server has: sent at initialize, then by didChangeConfiguration.
let sentOptions: Record<string, unknown> = {};
let statusBar: StatusBar;
let output: vscode.LogOutputChannel;
let trace: TraceChannel;
let snooze: Snooze;
let waitClock: WaitClock;
let completedNotes: CompletedNotes;
let globalState: vscode.Memento;
let starting: Promise<void> = Promise.resolve(); // start and restart run one at a time
// The completion requests on their way to the server (the middleware counts them): a restart that can
// wait for a pause between them does.
const requests = new InFlight();
// A pause this long, with nothing in flight, is one between two bursts of typing.
const QUIET_MS = 2000;
// A load that takes longer than this (a first conversion of a large model) is not waited for.
const LOAD_WAIT_MS = 10 * 60_000;
let following: Promise<void> | undefined; // followManagedEnvironment, one at a time
let deactivated = false;

const status = (state: SpecdecStatus['state'], message: string): SpecdecStatus => ({
  state,
  message,
  acceptance: null,
  p50_ms: null,
});

// Whether a request for this document may reach the server now.
function allowed(document: vscode.TextDocument): boolean {
  return languageEnabled(document.languageId) && !snooze.active();
}

function suggestItems(): boolean {
  return vscode.workspace.getConfiguration('specdec').get<boolean>('completionItems', true);
}

function gate(): Gate {
  const document = vscode.window.activeTextEditor?.document;
  const languageId = document?.languageId;
  const enabled = languageId ? languageEnabled(languageId) : globallyEnabled();
  const offReason = !globallyEnabled() ? 'off' : `off for ${languageId}`;
  return {
    enabled,
    offReason,
    snoozedMs: snooze.remainingMs(),
    manual: mode() === 'manual',
    inlineSuggestOff: inlineSuggestOff(document),
  };
}

function refreshStatusBar(): void {
  const current = gate();
  statusBar.setGate(current);
  if (current.inlineSuggestOff && current.enabled) {
    void offerInlineSuggest(globalState, vscode.window.activeTextEditor?.document);
  }
}

type InlineNext = Parameters<NonNullable<Middleware['provideInlineCompletionItems']>>[4];

// Ghost text: the gate, then the server. Measures what the user waits for a non-empty answer (from
// the keystroke, or from Alt+\ when invoked) and, when an explicit trigger gets nothing, says why.
async function provideInline(
  document: vscode.TextDocument,
  position: vscode.Position,
  context: vscode.InlineCompletionContext,
  token: vscode.CancellationToken,
  next: InlineNext,
): Promise<vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined> {
  const invoked = context.triggerKind === vscode.InlineCompletionTriggerKind.Invoke;
  if (!allowed(document)) {
    if (invoked) {
      const why = snooze.active() ? 'completions are snoozed' : `completions are off for ${document.languageId}`;
      statusBar.showNothingToOffer(why);
    }
    return undefined;
  }
  // Manual mode: only an explicit trigger (Alt+\, editor.action.inlineSuggest.trigger).
  if (mode() === 'manual' && !invoked) return undefined;
  const asked = performance.now();
  const waitStart = invoked ? asked : waitClock.waitStart(document, position, asked);
  statusBar.requestStarted();
  requests.started();
  try {
    const answer = await next(document, position, context, token);
    if (token.isCancellationRequested) return answer; // VS Code drops it: nothing reached the user
    const items = Array.isArray(answer) ? answer : answer?.items ?? [];
    if (items.length > 0) {
      waitClock.answered(document, position);
      if (waitStart !== undefined) statusBar.answered(performance.now() - waitStart);
    } else if (invoked) {
      statusBar.showNothingToOffer(emptyReason(document, asked));
    }
    return answer;
  } finally {
    statusBar.requestEnded();
    requests.ended();
  }
}

// Why the server's answer to a request sent at `asked` was empty, in words.
function emptyReason(document: vscode.TextDocument, asked: number): string {
  const uri = client ? client.code2ProtocolConverter.asUri(document.uri) : document.uri.toString();
  const note = completedNotes.since(uri, asked);
  if (note) return reasonWords(note.reason);
  // The server answers without a note when its models are not loaded (yet, or again).
  return statusBar.serverState() === 'loading' ? 'the models are still loading' : 'the server gave no reason';
}

function createClient(found: Server): LanguageClient {
  const { command, args } = commandLine(found, ['serve']);
  sentOptions = initializationOptions();
  output.info(`starting ${command} ${args.join(' ')} (found through ${found.source})`);
  // No `transport`: with TransportKind.stdio the client would append --stdio to the arguments;
  // plain pipes are stdio already.
  const serverOptions: ServerOptions = { command, args };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
    initializationOptions: sentOptions,
    outputChannel: output,
    traceOutputChannel: trace,
    stdioOptions: {
      stdout: (input, channel) => pipeStderr(input, channel),
      stderr: (input, channel) => pipeStderr(input, channel),
    },
    middleware: {
      provideInlineCompletionItems: provideInline,
      // The suggest widget asks as you type when quick suggestions are on (the server answers it in
      // its own lane and shares the decode with the ghost text's request at the same position). VS
      // Code reports its quick suggestions as Invoke, like Ctrl+Space, and the server would decode an
      // invoked request at once, even for a position the typing has already left: they are sent as
      // what they mostly are, automatic, so the server debounces them and drops a stale one (the
      // widget asks again, its list being incomplete). For the same reason manual mode sends none.
      provideCompletionItem: (document, position, context, token, next) => {
        if (!allowed(document) || !suggestItems() || mode() === 'manual') return undefined;
        const automatic =
          context.triggerKind === vscode.CompletionTriggerKind.Invoke
            ? { ...context, triggerKind: vscode.CompletionTriggerKind.TriggerForIncompleteCompletions }
            : context;
        statusBar.requestStarted();
        requests.started();
        return Promise.resolve(next(document, position, automatic, token)).finally(() => {
          statusBar.requestEnded();
          requests.ended();
        });
      },
      // The model load's work-done progress: vscode-languageclient shows it (a window progress);
      // the status bar mirrors its percentage ("specdec loading 42%").
      handleWorkDoneProgress: (token, params, next) => {
        if (params.kind === 'end') statusBar.progress(undefined, undefined, true);
        else statusBar.progress(params.percentage, params.message);
        next(token, params);
      },
    },
  };
  const c = new LanguageClient('specdec', 'specdec', serverOptions, clientOptions);
  c.onNotification('specdec/status', (s: SpecdecStatus) => statusBar.update(s));
  c.onNotification('specdec/completed', (note: Completed) => completedNotes.record(note));
  c.onDidChangeState((e) => {
    if (e.newState === State.Stopped) statusBar.update(status('error', 'server stopped'));
  });
  return c;
}

async function start(): Promise<void> {
  statusBar.update(status('loading', 'finding the server'));
  const found = await findServer(managedServer()).catch((e) => {
    output.error(`finding the server: ${e}`);
    return undefined;
  });
  server = found;
  if (!found && anotherWindowSettingUp()) {
    // Another window is making the managed environment: this one starts its server when it is done.
    output.info('no specdec server found yet: another VS Code window is setting up the server environment');
    statusBar.update(status('loading', 'waiting for another window to set up the server'));
    void followManagedEnvironment(undefined);
    return;
  }
  if (!found) {
    statusBar.update(status('error', 'server not found'));
    output.error('no specdec server found; see specdec.server.command');
    void offerInstall();
    return;
  }
  statusBar.update(status('loading', 'starting server'));
  client = createClient(found);
  try {
    await client.start();
  } catch (e) {
    statusBar.update(status('error', `could not start server: ${e}`));
    output.error(`could not start specdec server (${found.command}): ${e}`);
  }
}

async function stop(): Promise<void> {
  const old = client;
  client = undefined;
  if (old) {
    try {
      await old.stop();
    } catch (e) {
      output.warn(`stopping the server: ${e}`);
    }
  }
}

// Resolves once the running server has loaded its models or failed to (at most LOAD_WAIT_MS), or at
// once without one: the load imports some of speccomplete's modules as it goes, and an update that
// replaced them meanwhile could break it.
async function serverLoaded(): Promise<void> {
  const deadline = Date.now() + LOAD_WAIT_MS;
  while (client && statusBar.serverState() === 'loading' && Date.now() < deadline && !deactivated) {
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

// The managed environment, followed while the server runs: brought up to this .vsix's wheel in the
// background (or made or updated by another window, waited for), then, when it holds other files than
// when the server started (`startedOn`, its managedEnvironmentStamp then), the server restarts onto
// them between requests: once none is in flight and a moment passed without one.
function followManagedEnvironment(startedOn: string | undefined): Promise<void> {
  following ??= (async () => {
    if (!managedUpdateDue()) return;
    await serverLoaded();
    await updateManagedEnvironment(output, () => deactivated);
    if (deactivated) return;
    if (!server) {
      // None was found while another window set the environment up: look again, now that it is done.
      await restartServer();
      return;
    }
    if (server.source !== MANAGED || managedEnvironmentStamp() === startedOn) return;
    output.info('the server environment changed: restarting the server at the next pause between requests');
    if (await requests.quiet(QUIET_MS, () => deactivated)) await restartServer();
  })().finally(() => {
    following = undefined;
  });
  return following;
}

function restartServer(): Promise<void> {
  starting = starting.then(async () => {
    await stop();
    await start();
  });
  return starting;
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

async function snoozeCommand(): Promise<void> {
  const items: (vscode.QuickPickItem & { minutes: number })[] = [5, 15, 60].map((minutes) => ({
    label: `Snooze for ${minutes} minutes`,
    minutes,
  }));
  if (snooze.active()) items.push({ label: 'Resume completions now', minutes: 0 });
  const picked = await vscode.window.showQuickPick(items, { title: 'specdec: snooze completions' });
  if (!picked) return;
  if (picked.minutes) await snooze.snooze(picked.minutes);
  else await snooze.resume();
}

async function toggleLanguage(): Promise<void> {
  const languageId = vscode.window.activeTextEditor?.document.languageId;
  if (!languageId) {
    vscode.window.showInformationMessage('specdec: open a file to turn completions on or off for its language.');
    return;
  }
  await setLanguageEnabled(languageId, !languageEnabled(languageId));
}

async function setMode(manual: boolean): Promise<void> {
  await vscode.workspace
    .getConfiguration('specdec')
    .update('inlineSuggest.mode', manual ? 'manual' : 'automatic', vscode.ConfigurationTarget.Global);
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  output = vscode.window.createOutputChannel('specdec', { log: true });
  initManagedEnvironment(context);
  trace = new TraceChannel();
  snooze = new Snooze(context.globalState);
  globalState = context.globalState;
  waitClock = new WaitClock();
  completedNotes = new CompletedNotes();
  statusBar = new StatusBar(gate());
  context.subscriptions.push(
    output,
    trace,
    snooze,
    statusBar,
    waitClock,
    snooze.onDidChange(refreshStatusBar),
    vscode.window.onDidChangeActiveTextEditor(refreshStatusBar),
    vscode.commands.registerCommand('specdec.enableCompletions', () => setGloballyEnabled(true)),
    vscode.commands.registerCommand('specdec.disableCompletions', () => setGloballyEnabled(false)),
    vscode.commands.registerCommand('specdec.toggleLanguage', toggleLanguage),
    vscode.commands.registerCommand('specdec.snooze', snoozeCommand),
    vscode.commands.registerCommand('specdec.resume', () => snooze.resume()),
    vscode.commands.registerCommand('specdec.manualMode', () => setMode(true)),
    vscode.commands.registerCommand('specdec.automaticMode', () => setMode(false)),
    vscode.commands.registerCommand('specdec.restartServer', restartServer),
    vscode.commands.registerCommand('specdec.setUpServer', async () => {
      // A repair reinstalls the running server's files, which Windows keeps locked while it runs.
      if (server?.source === MANAGED) await stop();
      if (!client) statusBar.update(status('loading', 'setting up the server environment'));
      if (await setUpServerEnvironment(output)) await restartServer();
      else if (!client) statusBar.update(status('error', 'server not found'));
    }),
    vscode.commands.registerCommand('specdec.openTelemetryReport', async () => {
      const found = server ?? (await findServer(managedServer()));
      if (found) await openTelemetryReport(output, found);
      else void offerInstall();
    }),
    vscode.commands.registerCommand('specdec.showLog', () => output.show()),
    vscode.commands.registerCommand('specdec.turnOnInlineSuggest', () =>
      turnOnInlineSuggest(vscode.window.activeTextEditor?.document),
    ),
    vscode.commands.registerCommand('specdec.showMenu', showMenu),
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (
        e.affectsConfiguration('specdec.enable') ||
        e.affectsConfiguration('specdec.inlineSuggest.mode') ||
        e.affectsConfiguration('editor.inlineSuggest.enabled')
      ) {
        refreshStatusBar();
      }
      if (commandChanged(e)) await restartServer();
      else if (optionsChanged(e)) await updateOptions();
    }),
    // Trust brings back the workspace's own settings and its .venv: find the server again.
    vscode.workspace.onDidGrantWorkspaceTrust(() => restartServer()),
    // A new interpreter in the Python extension matters when the server came from it, or was not found.
    onInterpreterChange(() => {
      if (!server || server.source === PYTHON_EXTENSION) void restartServer();
    }),
  );
  refreshStatusBar(); // with the editor's ghost text off, say so now
  // The server starts from the environment as it is; a new .vsix's wheel goes into it afterwards.
  const startedOn = managedEnvironmentStamp();
  await restartServer();
  void followManagedEnvironment(startedOn);
}

export async function deactivate(): Promise<void> {
  deactivated = true;
  await stop();
}

async function showMenu(): Promise<void> {
  const languageId = vscode.window.activeTextEditor?.document.languageId;
  const items: { label: string; command: string }[] = [];
  const ghostTextOff = inlineSuggestOff(vscode.window.activeTextEditor?.document);
  if (ghostTextOff) {
    items.push({ label: `Turn on inline suggestions (off ${ghostTextOff})`, command: 'specdec.turnOnInlineSuggest' });
  }
  items.push(
    globallyEnabled()
      ? { label: 'Disable completions', command: 'specdec.disableCompletions' }
      : { label: 'Enable completions', command: 'specdec.enableCompletions' },
  );
  if (languageId) {
    const on = languageEnabled(languageId);
    items.push({ label: `${on ? 'Disable' : 'Enable'} completions for ${languageId}`, command: 'specdec.toggleLanguage' });
  }
  items.push(
    snooze.active()
      ? { label: 'Resume completions (end the snooze)', command: 'specdec.resume' }
      : { label: 'Snooze completions…', command: 'specdec.snooze' },
    mode() === 'manual'
      ? { label: 'Show completions as I type (automatic)', command: 'specdec.automaticMode' }
      : { label: 'Show completions only on Alt+\\ (manual)', command: 'specdec.manualMode' },
    { label: 'Restart server', command: 'specdec.restartServer' },
    ...(server ? [] : [{ label: 'Set up the server environment…', command: 'specdec.setUpServer' }]),
    { label: 'Open telemetry report', command: 'specdec.openTelemetryReport' },
    { label: 'Show server log', command: 'specdec.showLog' },
  );
  const picked = await vscode.window.showQuickPick(items, { title: `specdec: ${statusBar.describe()}` });
  if (picked) await vscode.commands.executeCommand(picked.command);
}
