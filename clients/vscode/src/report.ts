// "Open telemetry report": runs `specdec report` on the telemetry events into a temporary folder
// and opens its report.md; with no report (no events yet, or the command failed) it opens the
// events file itself, so the user still sees what was recorded.
import { execFile } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import * as vscode from 'vscode';
import { commandLine } from './locate';
import { Server } from './serverSources';
import { telemetryPath } from './settings';

function run(command: string, args: string[]): Promise<{ ok: boolean; output: string }> {
  return new Promise((resolve) => {
    execFile(command, args, { timeout: 120_000 }, (error, stdout, stderr) =>
      resolve({ ok: !error, output: `${stdout}${stderr}${error ? `\n${error.message}` : ''}` }),
    );
  });
}

export async function openTelemetryReport(output: vscode.LogOutputChannel, server: Server): Promise<void> {
  const events = telemetryPath();
  const outDir = fs.mkdtempSync(path.join(os.tmpdir(), 'specdec-report-'));
  const { command, args } = commandLine(server, ['report', events, '--out', outDir]);
  const result = await vscode.window.withProgress(
    { location: vscode.ProgressLocation.Window, title: 'specdec: building telemetry report' },
    () => run(command, args),
  );
  output.info(`${command} ${args.join(' ')}\n${result.output}`);
  const report = path.join(outDir, 'report.md');
  if (result.ok && fs.existsSync(report)) {
    await vscode.window.showTextDocument(vscode.Uri.file(report));
    await vscode.commands.executeCommand('markdown.showPreview', vscode.Uri.file(report));
    return;
  }
  if (fs.existsSync(events)) {
    await vscode.window.showTextDocument(vscode.Uri.file(events));
    vscode.window.showInformationMessage('specdec: no report could be built yet; showing the raw events.');
    return;
  }
  vscode.window.showWarningMessage(
    'specdec: no telemetry yet (is specdec.telemetry.enabled on?). See the specdec output for details.',
  );
}
