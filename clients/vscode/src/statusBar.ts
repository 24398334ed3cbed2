// The status bar item: server state (loading / ready / error) with rolling acceptance and p50
// latency, as reported by the server's `specdec/status` notification; the load's percentage from its
// work-done progress; and what the user set: off (globally or for the active editor's language),
// snoozed (with the minutes left) or manual trigger. Clicking opens the menu.
import * as vscode from 'vscode';

export interface SpecdecStatus {
  state: 'loading' | 'ready' | 'error';
  message: string;
  acceptance: number | null;
  p50_ms: number | null;
}

// What the extension decides, beside the server's state.
export interface Gate {
  enabled: boolean; // completions on for the active editor's language (or globally, with no editor)
  offReason: string; // "off" or "off for markdown"
  snoozedMs: number; // time left, 0 when not snoozed
  manual: boolean;
}

const ICONS: Record<SpecdecStatus['state'], string> = {
  loading: '$(loading~spin)',
  ready: '$(check)',
  error: '$(error)',
};

export class StatusBar implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem('specdec.status', vscode.StatusBarAlignment.Right, 100);
  private status: SpecdecStatus = { state: 'loading', message: '', acceptance: null, p50_ms: null };
  private percentage: number | undefined; // of the model load, while the server reports one
  private progressMessage = '';

  constructor(private gate: Gate) {
    this.item.name = 'specdec';
    this.item.command = 'specdec.showMenu';
    this.render();
    this.item.show();
  }

  update(status: SpecdecStatus): void {
    this.status = status;
    if (status.state !== 'loading') this.percentage = undefined;
    this.render();
  }

  // The load's work-done progress: a percentage (or undefined) and its message; `end` clears it.
  progress(percentage: number | undefined, message: string | undefined, end = false): void {
    this.percentage = end ? undefined : percentage ?? this.percentage;
    this.progressMessage = end ? '' : message ?? this.progressMessage;
    this.render();
  }

  setGate(gate: Gate): void {
    this.gate = gate;
    this.render();
  }

  // One line: "ready · 62% accepted · p50 180 ms · ..." (used in the tooltip and the menu title).
  describe(): string {
    const parts: string[] = [this.status.state];
    if (this.status.state === 'loading' && this.percentage !== undefined) parts[0] += ` ${Math.round(this.percentage)}%`;
    if (!this.gate.enabled) parts.push(`completions ${this.gate.offReason}`);
    if (this.gate.snoozedMs > 0) parts.push(`snoozed, ${minutesLeft(this.gate.snoozedMs)} left`);
    if (this.gate.manual) parts.push('manual trigger (Alt+\\)');
    const metrics = this.metrics();
    if (metrics) parts.push(metrics);
    const message = this.progressMessage || this.status.message;
    if (message) parts.push(message);
    return parts.join(' · ');
  }

  private metrics(): string {
    const parts: string[] = [];
    if (this.status.acceptance !== null && this.status.acceptance !== undefined) {
      parts.push(`${Math.round(this.status.acceptance * 100)}% accepted`);
    }
    if (this.status.p50_ms !== null && this.status.p50_ms !== undefined) {
      parts.push(`p50 ${Math.round(this.status.p50_ms)} ms`);
    }
    return parts.join(' · ');
  }

  private render(): void {
    let text: string;
    if (this.status.state === 'loading') {
      const pct = this.percentage !== undefined ? ` loading ${Math.round(this.percentage)}%` : '';
      text = `${ICONS.loading} specdec${pct}`;
    } else if (this.status.state === 'error') {
      text = `${ICONS.error} specdec`;
    } else if (!this.gate.enabled) {
      text = '$(circle-slash) specdec';
    } else if (this.gate.snoozedMs > 0) {
      text = `$(clock) specdec snoozed ${minutesLeft(this.gate.snoozedMs)}`;
    } else {
      const metrics = this.metrics();
      text = `${ICONS.ready} specdec${this.gate.manual ? ' (manual)' : ''}${metrics ? ' ' + metrics : ''}`;
    }
    this.item.text = text;
    this.item.tooltip = `specdec: ${this.describe()}`;
    this.item.backgroundColor =
      this.status.state === 'error' ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
  }

  dispose(): void {
    this.item.dispose();
  }
}

function minutesLeft(ms: number): string {
  const minutes = Math.ceil(ms / 60_000);
  return `${minutes} min`;
}
