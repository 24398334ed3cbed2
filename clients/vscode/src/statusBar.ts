// The status bar item: server state (loading / ready / error) with rolling acceptance and p50
// latency, as reported by the server's `specdec/status` notification. Clicking opens the menu.
import * as vscode from 'vscode';

export interface SpecdecStatus {
  state: 'loading' | 'ready' | 'error';
  message: string;
  acceptance: number | null;
  p50_ms: number | null;
}

const ICONS: Record<SpecdecStatus['state'], string> = {
  loading: '$(loading~spin)',
  ready: '$(check)',
  error: '$(error)',
};

export class StatusBar implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem('specdec.status', vscode.StatusBarAlignment.Right, 100);
  private status: SpecdecStatus = { state: 'loading', message: '', acceptance: null, p50_ms: null };

  constructor(private enabled: boolean) {
    this.item.name = 'specdec';
    this.item.command = 'specdec.showMenu';
    this.render();
    this.item.show();
  }

  update(status: SpecdecStatus): void {
    this.status = status;
    this.render();
  }

  setEnabled(enabled: boolean): void {
    this.enabled = enabled;
    this.render();
  }

  // One line: "ready, acceptance 62%, p50 180 ms" (used in the tooltip and the menu title).
  describe(): string {
    const parts: string[] = [this.enabled ? this.status.state : `${this.status.state}, completions off`];
    const metrics = this.metrics();
    if (metrics) parts.push(metrics);
    if (this.status.message) parts.push(this.status.message);
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
    const icon = this.enabled ? ICONS[this.status.state] : '$(circle-slash)';
    const metrics = this.status.state === 'ready' ? this.metrics() : '';
    this.item.text = `${icon} specdec${metrics ? ' ' + metrics : ''}`;
    this.item.tooltip = `specdec: ${this.describe()}`;
    this.item.backgroundColor =
      this.status.state === 'error' ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
  }

  dispose(): void {
    this.item.dispose();
  }
}
