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
  gamma: 'gamma',
  draftConfidence: 'draftConfidence',
  'maxTokens.singleLine': 'maxTokensSingleLine',
  'maxTokens.multiLine': 'maxTokensMultiLine',
  temperature: 'temperature',
  minConfidence: 'minConfidence',
  debounceMs: 'debounceMs',
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
