// VS Code settings (specdec.*) -> the server's command line and initializationOptions.
import * as os from 'os';
import * as path from 'path';
import * as vscode from 'vscode';

// Setting name -> initializationOptions key (server/options.py). A setting left unset (null, or "" for strings) is
// not sent, so the server's own default applies.
const SERVER_OPTIONS: Record<string, string> = {
  backend: 'backend',
  gguf: 'gguf',
  'llamacpp.speculative': 'llamacppSpeculative',
  'openai.url': 'openaiUrl',
  'openai.model': 'openaiModel',
  'openai.apiKeyEnv': 'openaiApiKeyEnv',
  target: 'target',
  draft: 'draft',
  device: 'device',
  dtype: 'dtype',
  quantization: 'quantization',
  compileStep: 'compileStep',
  gamma: 'gamma',
  draftConfidence: 'draftConfidence',
  draftTreeNodes: 'draftTreeNodes',
  'maxTokens.singleLine': 'maxTokensSingleLine',
  'maxTokens.multiLine': 'maxTokensMultiLine',
  blockBudgetMs: 'blockBudgetMs',
  temperature: 'temperature',
  minConfidence: 'minConfidence',
  debounceMs: 'debounceMs',
  prefillOnEdit: 'prefillOnEdit',
  rejectAfterS: 'rejectAfterS',
  promptBudgetChars: 'promptBudgetChars',
  contextBudgetChars: 'contextBudgetChars',
  maxDocumentChars: 'maxDocumentChars',
  tokenHealing: 'tokenHealing',
  'telemetry.enabled': 'telemetry',
  'telemetry.path': 'telemetryPath',
  'telemetry.includeText': 'telemetryText',
  'telemetry.retentionDays': 'telemetryRetentionDays',
  'telemetry.maxMegabytes': 'telemetryMaxMegabytes',
  // Deprecated in VS Code for `specdec.enable` (VS Code language ids, filtered here); still sent if set.
  enabledLanguages: 'enabledLanguages',
};

export function initializationOptions(): Record<string, unknown> {
  const config = vscode.workspace.getConfiguration('specdec');
  const options: Record<string, unknown> = {};
  for (const [setting, key] of Object.entries(SERVER_OPTIONS)) {
    const value = config.get(setting);
    if (value === null || value === undefined || value === '') continue;
    options[key] = value;
  }
  return options;
}

// Settings that change how the server process is found or started: changing one restarts it.
export function commandChanged(e: vscode.ConfigurationChangeEvent): boolean {
  return ['server.command', 'server.pythonPath', 'server.args'].some((s) => e.affectsConfiguration(`specdec.${s}`));
}

export function optionsChanged(e: vscode.ConfigurationChangeEvent): boolean {
  return Object.keys(SERVER_OPTIONS).some((s) => e.affectsConfiguration(`specdec.${s}`));
}

// The events file: the setting, else the server's default (telemetry/log.py default_path()).
export function telemetryPath(): string {
  const configured = vscode.workspace.getConfiguration('specdec').get<string>('telemetry.path', '');
  if (configured) return configured;
  const dataHome = process.env.XDG_DATA_HOME || path.join(os.homedir(), '.local', 'share');
  return path.join(dataHome, 'specdec', 'events.jsonl');
}

// Where the editor's own ghost text (`editor.inlineSuggest.enabled`) is off for a document, or in
// general without one: "for python", "in the editor", or "" when it is on. With it off VS Code never
// asks for inline completions, whatever specdec's settings say.
export function inlineSuggestOff(document?: vscode.TextDocument): string {
  const config = vscode.workspace.getConfiguration('editor', document);
  if (config.get<boolean>('inlineSuggest.enabled', true) !== false) return '';
  const inspected = config.inspect<boolean>('inlineSuggest.enabled');
  const byLanguage = [
    inspected?.defaultLanguageValue,
    inspected?.globalLanguageValue,
    inspected?.workspaceLanguageValue,
    inspected?.workspaceFolderLanguageValue,
  ].includes(false);
  return document && byLanguage ? `for ${document.languageId}` : 'in the editor';
}

// Turn it on wherever it is turned off: each settings level (user, workspace, folder; general or for
// the document's language) that says false gets true.
export async function turnOnInlineSuggest(document?: vscode.TextDocument): Promise<void> {
  const key = 'inlineSuggest.enabled';
  const config = vscode.workspace.getConfiguration('editor', document);
  const inspected = config.inspect<boolean>(key);
  const levels: [boolean | undefined, vscode.ConfigurationTarget, boolean][] = [
    [inspected?.globalValue, vscode.ConfigurationTarget.Global, false],
    [inspected?.workspaceValue, vscode.ConfigurationTarget.Workspace, false],
    [inspected?.workspaceFolderValue, vscode.ConfigurationTarget.WorkspaceFolder, false],
    [inspected?.globalLanguageValue, vscode.ConfigurationTarget.Global, true],
    [inspected?.workspaceLanguageValue, vscode.ConfigurationTarget.Workspace, true],
    [inspected?.workspaceFolderLanguageValue, vscode.ConfigurationTarget.WorkspaceFolder, true],
  ];
  for (const [value, target, forLanguage] of levels) {
    if (value === false) await config.update(key, true, target, forLanguage && document !== undefined);
  }
  // Off by a default (an extension's language default): the user's language setting overrides it.
  if (document && vscode.workspace.getConfiguration('editor', document).get<boolean>(key, true) === false) {
    await config.update(key, true, vscode.ConfigurationTarget.Global, true);
  }
}

const INLINE_SUGGEST_QUIET = 'specdec.inlineSuggestOffQuiet';
let inlineSuggestOffered = false;

// Once a window session (never again after "Don't Show Again"): say that the editor's ghost text is
// off, with a button that turns it on.
export async function offerInlineSuggest(state: vscode.Memento, document?: vscode.TextDocument): Promise<void> {
  const where = inlineSuggestOff(document);
  if (!where || inlineSuggestOffered || state.get<boolean>(INLINE_SUGGEST_QUIET, false)) return;
  inlineSuggestOffered = true;
  const turnOn = 'Turn On';
  const quiet = "Don't Show Again";
  const picked = await vscode.window.showWarningMessage(
    `specdec: inline suggestions are off ${where} (editor.inlineSuggest.enabled), so no ghost text will show.`,
    turnOn,
    quiet,
  );
  if (picked === turnOn) await turnOnInlineSuggest(document);
  else if (picked === quiet) await state.update(INLINE_SUGGEST_QUIET, true);
}
