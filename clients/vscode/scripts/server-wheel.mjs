// `npm run server-wheel`: the speccomplete wheel that the .vsix carries (dist/server/), with the setup's
// compile-ahead script and its list beside it (clients/setup), built from the repository
// this folder sits in (clients/vscode, two levels below its root) with that repository's .venv Python, else
// $PYTHON or python3. Outside a clone of the repository it stops with a message and removes nothing.
import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { fileURLToPath } from 'url';

const extension = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const repo = path.resolve(extension, '..', '..');
const pyproject = path.join(repo, 'pyproject.toml');
if (!fs.existsSync(pyproject) || !/^name = "speccomplete"$/m.test(fs.readFileSync(pyproject, 'utf8'))) {
  console.error(
    `server-wheel: ${repo} is not the speccomplete repository; ` +
      'build the .vsix from clients/vscode inside a clone of it',
  );
  process.exit(1);
}
const venv = path.join(repo, '.venv', process.platform === 'win32' ? 'Scripts/python.exe' : 'bin/python');
const python = fs.existsSync(venv) ? venv : process.env.PYTHON || 'python3';
const wheels = path.join(extension, 'dist', 'server');
fs.rmSync(wheels, { recursive: true, force: true });
// setuptools' scratch folder from an earlier build: files since removed would ride along in the wheel
fs.rmSync(path.join(repo, 'build'), { recursive: true, force: true });
const pip = ['-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '--quiet', '--wheel-dir', wheels, repo];
try {
  execFileSync(python, pip, { stdio: 'inherit' });
} catch {
  console.error(
    `server-wheel: ${python} -m pip wheel failed; it needs pip and setuptools >= 77 ` +
      '(bash .ci/setup makes a .venv with both)',
  );
  process.exit(1);
}
// the trained drafts' weights stay out: the default draft reads only their vocabulary (tools/lean_wheel.py)
const built = fs.readdirSync(wheels).filter((name) => name.endsWith('.whl'));
execFileSync(python, ['-m', 'tools.lean_wheel', ...built.map((name) => path.join(wheels, name))], {
  cwd: repo,
  stdio: 'inherit',
});
// what the setup runs beside pip to compile a server start's modules ahead (clients/setup)
for (const name of ['compile_ahead.py', 'startup-modules.txt']) {
  fs.copyFileSync(path.join(repo, 'clients', 'setup', name), path.join(wheels, name));
}
