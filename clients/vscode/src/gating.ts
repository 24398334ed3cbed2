// Whether a completion request goes to the server at all: per-language enablement (`specdec.enable`),
// snooze, and the trigger mode (`specdec.inlineSuggest.mode`). The language client's middleware asks
// here before it sends textDocument/inlineCompletion or textDocument/completion, so the server never
// decodes for a disabled language, while snoozed, or (in manual mode) while the user types.
import * as vscode from 'vscode';

// `specdec.enable`: true / false for every language, or by VS Code language id with "*" for the rest,
// as GitHub Copilot's `github.copilot.enable`. VS Code merges an object the user sets with the default
// object, so `{"markdown": true}` turns markdown on and keeps the other defaults.
export type Enable = boolean | Record<string, boolean>;

function enableSetting(): Enable {
  return vscode.workspace.getConfiguration('specdec').get<Enable>('enable', true);
}

export function languageEnabled(languageId: string, enable: Enable = enableSetting()): boolean {
  if (typeof enable === 'boolean') return enable;
  if (enable === null || typeof enable !== 'object') return true;
  const own = enable[languageId];
  if (typeof own === 'boolean') return own;
  return enable['*'] !== false;
}

// On for every language not listed ("*"): what the Enable / Disable Completions commands switch.
export function globallyEnabled(enable: Enable = enableSetting()): boolean {
  if (typeof enable === 'boolean') return enable;
  return enable === null || typeof enable !== 'object' || enable['*'] !== false;
}

// Where to write `specdec.enable`: the workspace if it sets one (a user value there would be
// hidden by it), else the user settings. The new value keeps that level's other languages.
async function writeEnable(change: (own: Record<string, boolean>) => void): Promise<void> {
  const config = vscode.workspace.getConfiguration('specdec');
  const inspected = config.inspect<Enable>('enable');
  const target =
    inspected?.workspaceValue !== undefined ? vscode.ConfigurationTarget.Workspace : vscode.ConfigurationTarget.Global;
  const current = target === vscode.ConfigurationTarget.Workspace ? inspected?.workspaceValue : inspected?.globalValue;
  const own: Record<string, boolean> =
    typeof current === 'boolean' ? { '*': current } : current && typeof current === 'object' ? { ...current } : {};
  change(own);
  await config.update('enable', own, target);
}

export async function setGloballyEnabled(enabled: boolean): Promise<void> {
  await writeEnable((own) => {
    own['*'] = enabled;
  });
}

export async function setLanguageEnabled(languageId: string, enabled: boolean): Promise<void> {
  await writeEnable((own) => {
    own[languageId] = enabled;
  });
}

export type Mode = 'automatic' | 'manual';

export function mode(): Mode {
  return vscode.workspace.getConfiguration('specdec').get<Mode>('inlineSuggest.mode', 'automatic') === 'manual'
    ? 'manual'
    : 'automatic';
}

// Snooze: no completions until a time, kept in globalState so a window reload keeps it.
export class Snooze implements vscode.Disposable {
  private static readonly KEY = 'specdec.snoozedUntil';
  private timer: NodeJS.Timeout | undefined;
  private readonly changed = new vscode.EventEmitter<void>();
  readonly onDidChange = this.changed.event;

  constructor(private readonly state: vscode.Memento) {
    this.arm();
  }

  // Milliseconds left, or 0 when not snoozed.
  remainingMs(): number {
    const until = this.state.get<number>(Snooze.KEY, 0);
    return Math.max(0, until - Date.now());
  }

  active(): boolean {
    return this.remainingMs() > 0;
  }

  async snooze(minutes: number): Promise<void> {
    await this.state.update(Snooze.KEY, Date.now() + minutes * 60_000);
    this.arm();
    this.changed.fire();
  }

  async resume(): Promise<void> {
    await this.state.update(Snooze.KEY, undefined);
    this.arm();
    this.changed.fire();
  }

  // Fire every 15 s while snoozed (the status bar counts down) and once when it ends.
  private arm(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    if (!this.active()) return;
    this.timer = setInterval(() => {
      if (!this.active()) {
        clearInterval(this.timer);
        this.timer = undefined;
      }
      this.changed.fire();
    }, 15_000);
  }

  dispose(): void {
    if (this.timer) clearInterval(this.timer);
    this.changed.dispose();
  }
}
