import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT } from '../../client/processes';
import { vllmStructuredOutputsConfig } from '../../lib/model-io/action-grammar';

// launch.sh: `gpu --dry-run` and `resume --dry-run` print every command (bin/launch-gpu.sh) and run none. Node from PyPI:
// test/integration/launch-node.test.ts.
function launch(args: string[], env: Record<string, string> = {}): string {
  const dir = mkdtempSync(join(tmpdir(), 'halo-launch-'));
  try {
    return execFileSync(join(REPO_ROOT, 'launch.sh'), args, {
      cwd: REPO_ROOT,
      env: { ...process.env, HALO_LORA_RANK: '', HALO_POLICY_API_KEY: '', HALO_ENV_FILE: '', HALO_LAUNCH_STATE: join(dir, 'state.env'), ...env },
      encoding: 'utf8',
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const lineWith = (out: string, re: RegExp) => {
  const l = out.split('\n').find((x) => re.test(x));
  assert.ok(l, `no line matches ${re}:\n${out}`);
  return l;
};

test('./launch.sh --skip-setup gpu --dry-run: vLLM in its own venv with the flags training needs, the learner on the same model, then grpo-real', () => {
  const out = launch(['--skip-setup', 'gpu', '--dry-run', '--lr', '2e-5'], { HALO_LORA_RANK: '128', HALO_POLICY_API_KEY: 'sk-do-not-print' });
  assert.doesNotMatch(out, /sk-do-not-print/, 'the key is referenced, never printed');
  lineWith(out, /python3(\.\d+)? -m venv --clear \.venv-vllm$/);
  const install = lineWith(out, /pip install/);
  assert.match(install, /\.venv-vllm\/bin\/pip install .*vllm==\d/);
  assert.ok(!out.split('\n').some((l) => /(^|\s)\.venv\/bin\/pip/.test(l)), "nothing is installed into the learner's .venv");
  lineWith(out, /\.venv-vllm\/bin\/hf download Qwen\/Qwen3-VL-8B-Instruct$/);

  const serve = lineWith(out, /vllm serve/);
  assert.match(serve, /VLLM_ALLOW_RUNTIME_LORA_UPDATING=True /);
  assert.match(serve, /\.venv-vllm\/bin\/vllm serve Qwen\/Qwen3-VL-8B-Instruct /);
  assert.match(serve, / --enable-lora /);
  assert.match(serve, / --max-lora-rank 128 /, 'max rank ≥ HALO_LORA_RANK');
  assert.match(serve, / --gpu-memory-utilization 0\.5 /, 'half the GPU: the learner shares it');
  assert.match(serve, / --logprobs-mode processed_logprobs/);
  // Constrained decoding without free whitespace: the grammar the learner compiles (policy.grammarWhitespace compact).
  const so = / --structured-outputs-config '([^']*)'/.exec(serve);
  assert.ok(so, `no --structured-outputs-config in ${serve}`);
  assert.deepEqual(JSON.parse(so[1]), JSON.parse(vllmStructuredOutputsConfig('compact')));
  assert.match(serve, /\( VLLM_API_KEY="\$HALO_POLICY_API_KEY" VLLM_ALLOW_RUNTIME_LORA_UPDATING=True setsid /, 'the key reaches vLLM through its environment');
  assert.doesNotMatch(serve, /--api-key/, 'never on the command line, where ps shows it');
  assert.equal(spawnSync('bash', ['-n', '-c', serve]).status, 0, 'the printed command is valid bash');

  const upLine = lineWith(out, /npx halo up$/);
  assert.match(upLine, /HALO_MODEL=Qwen\/Qwen3-VL-8B-Instruct /, 'the learner holds the model vLLM serves');
  assert.match(upLine, /HALO_LORA_RANK=128 /);
  const train = lineWith(out, /npx halo train/);
  assert.match(train, /--config configs\/grpo-real\.yaml --lr 2e-5$/, 'extra arguments go to halo train');
  const order = [/vllm serve/, /hf download/, /npx halo up/, /npx halo train/].map((re) => out.split('\n').findIndex((l) => re.test(l)));
  assert.ok(order[1] < order[0] && order[0] < order[2] && order[2] < order[3], 'download, vLLM, stack, training');
});

test('the default LoRA rank gives --max-lora-rank 64 and no key; a rank vLLM cannot serve is refused', () => {
  const serve = lineWith(launch(['--skip-setup', 'gpu', '--dry-run']), /vllm serve/);
  assert.match(serve, / --max-lora-rank 64 /);
  assert.doesNotMatch(serve, /--api-key|VLLM_API_KEY/);
  assert.throws(() => launch(['--skip-setup', 'gpu', '--dry-run'], { HALO_LORA_RANK: '1024' }), /largest LoRA rank/);
});

test('./launch.sh resume --dry-run brings back what was recorded, never the local default job', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-launch-state-'));
  try {
    const state = join(dir, 'state.env');
    writeFileSync(state, 'HALO_LAUNCH_MODE=gpu\nHALO_GPU_MODEL=Qwen/Qwen3-VL-8B-Instruct\nHALO_LORA_RANK=32\nHALO_VLLM_PORT=8001\n');
    const gpu = launch(['resume', '--dry-run'], { HALO_LAUNCH_STATE: state });
    assert.match(lineWith(gpu, /vllm serve/), / --port 8001 .* --max-lora-rank 64 /);
    assert.match(
      lineWith(gpu, /npx halo up$/),
      /HALO_MODEL=Qwen\/Qwen3-VL-8B-Instruct HALO_LORA_RANK=32 HALO_VLLM_PORT=8001 /,
      'the workers send the policy key to that port only',
    );
    lineWith(gpu, /npx halo runs --status Running --json .* npx halo resume "\$run"/);
    assert.doesNotMatch(gpu, /halo train|default\.yaml/, 'no job is started');

    const local = launch(['resume', '--dry-run'], { HALO_LAUNCH_STATE: join(dir, 'missing.env') });
    lineWith(local, /^npx halo up$/);
    assert.doesNotMatch(local, /halo train|default\.yaml|vllm/);
    assert.equal(existsSync(join(dir, 'missing.env')), false, 'a dry run writes nothing');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// A PATH with only what launch.sh's dry run needs, plus fake Pythons (`--version` only) and, optionally, apt-cache.
function fakeBin(dir: string, pythons: Record<string, string>, extra: Record<string, string> = {}): string {
  const bin = join(dir, 'bin');
  mkdirSync(bin, { recursive: true });
  for (const tool of ['bash', 'dirname', 'grep', 'id', 'cat', 'head', 'sed']) {
    const real = spawnSync('bash', ['-c', `command -v ${tool}`], { encoding: 'utf8' }).stdout.trim();
    if (real) symlinkSync(real, join(bin, tool));
  }
  for (const [name, version] of Object.entries(pythons)) writeFileSync(join(bin, name), `#!/bin/sh\necho "Python ${version}"\n`, { mode: 0o755 });
  for (const [name, script] of Object.entries(extra)) writeFileSync(join(bin, name), `#!/bin/sh\n${script}\n`, { mode: 0o755 });
  return bin;
}

const APT_CACHE_311 = `case "$2" in python3.11-venv) printf '%s:\\n  Installed: (none)\\n  Candidate: 3.11.0~rc1-1~22.04\\n' "$2" ;; *) printf '%s:\\n  Installed: (none)\\n  Candidate: (none)\\n' "$2" ;; esac`;

function gpuPlan(pythons: Record<string, string>, env: Record<string, string> = {}, extra: Record<string, string> = {}): string {
  const dir = mkdtempSync(join(tmpdir(), 'halo-launch-py-'));
  try {
    return launch(['--skip-setup', 'gpu', '--dry-run'], { PATH: fakeBin(dir, pythons, extra), HALO_VLLM_VERSION: '', HALO_VLLM_PYTHON: '', ...env });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('./launch.sh gpu --dry-run on Python 3.10 only (Ubuntu 22.04, no newer Python in apt): vLLM 0.31.0, chosen and said', () => {
  const out = gpuPlan({ python3: '3.10.12' });
  assert.match(lineWith(out, /^# vLLM/), /^# vLLM 0\.31\.0 on Python 3\.10 \(python3\).*the newest release for 3\.10.*0\.33\.0.*Python >= 3\.11/);
  assert.match(lineWith(out, /-m venv/), /\(3, 10\)\)'; \} \|\| python3 -m venv --clear \.venv-vllm$/);
  assert.match(lineWith(out, /pip install/), /sys\.exit\(m\.version\("vllm"\) != "0\.31\.0"\)'.* \|\| \.venv-vllm\/bin\/pip install --disable-pip-version-check vllm==0\.31\.0$/);
  assert.doesNotMatch(out, /apt-get|0\.33\.0 on/);
  lineWith(out, /vllm serve/);
});

test('./launch.sh gpu --dry-run on Python 3.10 with python3.11-venv in apt: installs it and takes vLLM 0.33.0 on 3.11', () => {
  const out = gpuPlan({ python3: '3.10.12' }, {}, { 'apt-cache': APT_CACHE_311 });
  assert.match(lineWith(out, /^# vLLM/), /needs Python 3\.11-3\.14 and none is on PATH: installing apt's python3\.11 python3\.11-venv python3\.11-dev/);
  assert.match(
    lineWith(out, /apt-get install/),
    /^command -v python3\.11 >\/dev\/null \|\| \{ (sudo )?apt-get update -qq && DEBIAN_FRONTEND=noninteractive (sudo )?apt-get install -y -qq python3\.11 python3\.11-venv python3\.11-dev; \}$/,
  );
  assert.match(lineWith(out, /-m venv/), /\(3, 11\)\)'; \} \|\| python3\.11 -m venv --clear \.venv-vllm$/);
  assert.match(lineWith(out, /pip install/), /vllm==0\.33\.0$/);
  const order = [/apt-get install/, /-m venv/, /pip install/].map((re) => out.split('\n').findIndex((l) => re.test(l)));
  assert.ok(order[0] < order[1] && order[1] < order[2], 'apt, venv, pip');
});

test('./launch.sh gpu --dry-run on Python 3.11 and 3.12: vLLM 0.33.0 on the system python3, or on a python3.12 beside an old python3', () => {
  for (const v of ['3.11.9', '3.12.3']) {
    const out = gpuPlan({ python3: v }, {}, { 'apt-cache': APT_CACHE_311 });
    const minor = v.split('.')[1];
    assert.match(lineWith(out, /^# vLLM/), new RegExp(`^# vLLM 0\\.33\\.0 on Python 3\\.${minor} \\(python3\\) in \\.venv-vllm$`));
    assert.match(lineWith(out, /-m venv/), new RegExp(`\\(3, ${minor}\\)\\)'; \\} \\|\\| python3 -m venv --clear \\.venv-vllm$`));
    assert.match(lineWith(out, /pip install/), /vllm==0\.33\.0$/);
    assert.doesNotMatch(out, /apt-get/, 'nothing from apt when PATH has a Python vLLM supports');
  }
  const side = gpuPlan({ python3: '3.10.12', 'python3.12': '3.12.3' });
  assert.match(lineWith(side, /^# vLLM/), /^# vLLM 0\.33\.0 on Python 3\.12 \(python3\.12\)/);
  assert.match(lineWith(side, /-m venv/), /python3\.12 -m venv --clear \.venv-vllm$/);
  // HALO_VLLM_PYTHON picks the Python: the 3.10 one gives 0.31.0 even with python3.12 on PATH.
  const forced = gpuPlan({ python3: '3.10.12', 'python3.12': '3.12.3' }, { HALO_VLLM_PYTHON: 'python3' });
  assert.match(lineWith(forced, /pip install/), /vllm==0\.31\.0$/);
});

test('./launch.sh gpu --dry-run: a HALO_VLLM_VERSION the Python cannot install, or no Python at all, stops with what to install', () => {
  assert.throws(
    () => gpuPlan({ python3: '3.10.12' }, { HALO_VLLM_VERSION: '0.33.0' }),
    /vLLM 0\.33\.0 needs Python 3\.11-3\.14; python3 is Python 3\.10 \(install python3\.12 or python3\.11/,
  );
  assert.match(lineWith(gpuPlan({ python3: '3.10.12' }, { HALO_VLLM_VERSION: '0.30.0' }), /pip install/), /vllm==0\.30\.0$/);
  assert.throws(() => gpuPlan({}), /no Python for vLLM's venv/);
});

test("vLLM's key: read from .env when the environment lacks it, handed over as VLLM_API_KEY, never printed nor on vLLM's command line", () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-launch-key-'));
  try {
    const envFile = join(dir, '.env');
    writeFileSync(envFile, '# secrets\nOTHER=1\nexport HALO_POLICY_API_KEY="sk-from-dotenv-123"  # vLLM and the workers\n');
    const base: Record<string, string | undefined> = { ...process.env };
    delete base.HALO_POLICY_API_KEY;
    delete base.HALO_CREDENTIAL_POLICY_ENV;
    const run = (args: string[], extraEnv: Record<string, string> = {}) =>
      execFileSync(join(REPO_ROOT, 'launch.sh'), args, {
        cwd: REPO_ROOT,
        env: { ...base, HALO_LORA_RANK: '', HALO_ENV_FILE: envFile, HALO_LAUNCH_STATE: join(dir, 'state.env'), ...extraEnv } as NodeJS.ProcessEnv,
        encoding: 'utf8',
      });
    for (const args of [
      ['--skip-setup', 'gpu', '--dry-run'],
      ['resume', '--dry-run'],
    ]) {
      writeFileSync(join(dir, 'state.env'), 'HALO_LAUNCH_MODE=gpu\n');
      const out = run(args);
      assert.doesNotMatch(out, /sk-from-dotenv/, 'the value is never printed');
      const serve = lineWith(out, /vllm serve/);
      assert.match(serve, /VLLM_API_KEY="\$HALO_POLICY_API_KEY" VLLM_ALLOW_RUNTIME_LORA_UPDATING=True setsid /, `${args.join(' ')}: the key is passed`);
      assert.doesNotMatch(serve, /--api-key/);
      if (args[1] === 'gpu') lineWith(out, /^# vLLM requires the policy key: \$HALO_POLICY_API_KEY \(from .*\.env\) is passed as VLLM_API_KEY/);
    }
    // An empty value in the environment wins over .env (the .env rule of host/env-file.ts): no key.
    assert.doesNotMatch(lineWith(run(['--skip-setup', 'gpu', '--dry-run'], { HALO_POLICY_API_KEY: '' }), /vllm serve/), /VLLM_API_KEY/);
    // HALO_CREDENTIAL_POLICY_ENV (the workers' mapping) names the variable, here from .env too.
    writeFileSync(envFile, 'HALO_CREDENTIAL_POLICY_ENV=MY_VLLM_KEY\nMY_VLLM_KEY=sk-mine\n');
    assert.match(lineWith(run(['--skip-setup', 'gpu', '--dry-run']), /vllm serve/), /\( VLLM_API_KEY="\$MY_VLLM_KEY" /);

    // The printed command, run with a stand-in vllm: the key arrives in its environment, not in its arguments.
    const fake = join(dir, 'vllm');
    writeFileSync(fake, `#!/bin/sh\necho "key=$VLLM_API_KEY args=$*" > ${join(dir, 'seen')}\n`, { mode: 0o755 });
    writeFileSync(envFile, 'HALO_POLICY_API_KEY=sk-run-456\n');
    const serve = lineWith(run(['--skip-setup', 'gpu', '--dry-run']), /vllm serve/)
      .match(/\( (VLLM_API_KEY=.*) > runs\/logs/)![1]
      .replace('.venv-vllm/bin/vllm', fake);
    execFileSync('bash', ['-c', serve], { env: { ...base, HALO_POLICY_API_KEY: 'sk-run-456' } as NodeJS.ProcessEnv });
    for (let i = 0; i < 50 && !existsSync(join(dir, 'seen')); i++) spawnSync('sleep', ['0.1']);
    const seen = execFileSync('cat', [join(dir, 'seen')], { encoding: 'utf8' });
    assert.match(seen, /^key=sk-run-456 args=serve /);
    assert.doesNotMatch(seen.replace(/^key=\S+/, ''), /sk-run-456/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** launch.sh with stand-ins: nvidia-smi answering `nvidiaSmi`, npx recording what it was asked to run (nothing starts). */
function launchWithGpu(args: string[], nvidiaSmi: string): { status: number | null; stdout: string; stderr: string[] } {
  const dir = mkdtempSync(join(tmpdir(), 'halo-launch-hint-'));
  try {
    const bin = join(dir, 'bin');
    mkdirSync(bin);
    writeFileSync(join(bin, 'npx'), '#!/bin/sh\necho "ran: npx $*" >&2\n', { mode: 0o755 });
    writeFileSync(join(bin, 'nvidia-smi'), `#!/bin/sh\n${nvidiaSmi}\n`, { mode: 0o755 });
    const r = spawnSync(join(REPO_ROOT, 'launch.sh'), args, {
      cwd: REPO_ROOT,
      env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, HALO_ENV_FILE: '', HALO_LORA_RANK: '', HALO_POLICY_API_KEY: '', HALO_LAUNCH_STATE: join(dir, 'state.env') },
      encoding: 'utf8',
    });
    return { status: r.status, stdout: r.stdout, stderr: r.stderr.split('\n') };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const H100 = 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1234)"';
const NO_DRIVER = 'echo "NVIDIA-SMI has failed" >&2; exit 9';

test("a bare ./launch.sh on an NVIDIA machine is the seeds' job (the GPU plan); ./launch.sh local stays one word away", () => {
  const gpu = launchWithGpu(['--skip-setup', '--dry-run'], H100);
  assert.equal(gpu.status, 0, gpu.stderr.join('\n'));
  lineWith(gpu.stdout, /\.venv-vllm\/bin\/vllm serve Qwen\/Qwen3-VL-8B-Instruct /);
  lineWith(gpu.stdout, /npx halo train --config configs\/grpo-real\.yaml$/);
  assert.doesNotMatch(gpu.stdout, /default\.yaml/);
  const said = gpu.stderr.find((l) => /NVIDIA GPU here/.test(l)) ?? assert.fail(gpu.stderr.join('\n'));
  assert.match(
    said,
    /NVIDIA GPU here \(GPU 0: NVIDIA H100 80GB HBM3\): the seeds' job \(vLLM serving Qwen\/Qwen3-VL-8B-Instruct.*configs\/grpo-real\.yaml\); the local job is \.\/launch\.sh local$/,
  );

  const local = launchWithGpu(['--skip-setup', 'local', '--dry-run'], H100);
  assert.equal(local.status, 0, local.stderr.join('\n'));
  assert.deepEqual(
    local.stdout.split('\n').filter((l) => /^npx /.test(l)),
    ['npx halo up', 'npx halo train --config configs/default.yaml'],
  );
  assert.doesNotMatch(local.stdout, /vllm|grpo-real/);
  assert.ok(
    local.stderr.some((l) => /running the local job \(tiny-random on MiniWoB\+\+\) as asked; the seeds' job is \.\/launch\.sh /.test(l)),
    local.stderr.join('\n'),
  );
});

test('a bare ./launch.sh without a GPU (no driver, or nvidia-smi -L listing none) runs the local job and says where the real one is', () => {
  for (const smi of [NO_DRIVER, 'exit 0']) {
    const r = launchWithGpu(['--skip-setup', '--dry-run'], smi);
    assert.equal(r.status, 0, r.stderr.join('\n'));
    lineWith(r.stdout, /^npx halo train --config configs\/default\.yaml$/);
    assert.doesNotMatch(r.stdout, /vllm/);
    assert.ok(
      r.stderr.some((l) => /no NVIDIA GPU here .*the local job .*on a GPU box \.\/launch\.sh runs the seeds' job/.test(l)),
      r.stderr.join('\n'),
    );
  }
});

test('./launch.sh local (not a dry run) starts the local stack and the default job, after saying so', () => {
  const r = launchWithGpu(['--skip-setup', 'local'], H100);
  assert.equal(r.status, 0, r.stderr.join('\n'));
  const hint = r.stderr.findIndex((l) => /as asked; the seeds' job is \.\/launch\.sh/.test(l));
  assert.ok(hint >= 0, r.stderr.join('\n'));
  const up = r.stderr.indexOf('ran: npx halo up');
  assert.ok(hint < up, 'said before the local job starts');
  assert.ok(up < r.stderr.indexOf('ran: npx halo train --config configs/default.yaml'), r.stderr.join('\n'));
  assert.ok(r.stderr.some((l) => /status: npx halo status grpo-local/.test(l)));
});

test('./launch.sh gpu serve --dry-run: vLLM alone, with every flag the served contract needs; nothing else starts', () => {
  const out = launch(['--skip-setup', 'gpu', 'serve', '--dry-run'], { HALO_LORA_RANK: '128' });
  const serve = lineWith(out, /vllm serve/);
  for (const flag of [
    /VLLM_ALLOW_RUNTIME_LORA_UPDATING=True /,
    / --enable-lora /,
    / --max-lora-rank 128 /,
    / --logprobs-mode processed_logprobs /,
    / --generation-config vllm /,
    / --structured-outputs-config '\{"backend":"xgrammar","disable_any_whitespace":true\}'/,
  ]) {
    assert.match(serve, flag);
  }
  lineWith(out, /^until curl -sf http:\/\/127\.0\.0\.1:8000\/health/);
  lineWith(out, /^# vLLM serves Qwen\/Qwen3-VL-8B-Instruct at http:\/\/127\.0\.0\.1:8000\/v1 .*HALO_MODEL=Qwen\/Qwen3-VL-8B-Instruct HALO_LORA_RANK=128/);
  assert.doesNotMatch(out, /npx halo (up|train|mcts)|launch-state/, 'no stack, no job, no recorded state');
  assert.throws(() => launch(['--skip-setup', 'gpu', 'serve', '--dry-run', '--lr', '1']), /gpu serve takes no flags/);
});

test('./launch.sh gpu mcts --dry-run: the same vLLM and learner, then MCTS + DPO on REAL with the flags given', () => {
  const mcts = launch(['--skip-setup', 'gpu', 'mcts', '--dry-run', '--iterations', '2']);
  const grpo = launch(['--skip-setup', 'gpu', '--dry-run']);
  assert.equal(lineWith(mcts, /vllm serve/), lineWith(grpo, /vllm serve/));
  assert.equal(lineWith(mcts, /npx halo up$/), lineWith(grpo, /npx halo up$/));
  assert.match(
    lineWith(mcts, /npx halo mcts/),
    /^HALO_MODEL=Qwen\/Qwen3-VL-8B-Instruct HALO_LORA_RANK=16 HALO_VLLM_PORT=8000 npx halo mcts --config configs\/mcts-real\.yaml --iterations 2$/,
  );
  assert.doesNotMatch(mcts, /halo train/);
});

/** The vLLM command the launcher runs, as a person types it: no setsid, vllm from any venv. */
function launcherVllmCommand(): string {
  const line = lineWith(launch(['--skip-setup', 'gpu', 'serve', '--dry-run']), /vllm serve/);
  return /\( (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True .*) > runs\/logs\/vllm\.log/.exec(line)![1].replace('setsid .venv-vllm/bin/vllm', 'vllm');
}

/** Every `vllm serve` command of a file (comment markers and line continuations removed). */
function vllmCommandsIn(text: string): string[] {
  const lines = text.split('\n').map((l) => l.replace(/^#\s*/, '').trim());
  const out: string[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (!/^(\w+=\S+ )*vllm serve /.test(lines[i])) continue;
    let cmd = lines[i];
    while (cmd.endsWith('\\')) cmd = `${cmd.slice(0, -1).trim()} ${lines[++i]}`;
    out.push(cmd.replace(/\s+#.*$/, ''));
  }
  return out;
}

test("the vllm serve commands of the REAL configs' headers and docs/episodes.md are the one the launcher runs", () => {
  const expected = launcherVllmCommand();
  for (const file of ['configs/mcts-real.yaml', 'configs/grpo-real.yaml', 'docs/episodes.md']) {
    const found = vllmCommandsIn(readFileSync(join(REPO_ROOT, file), 'utf8')).filter((c) => !/docker|--host 0\.0\.0\.0/.test(c));
    assert.ok(found.length > 0, `${file}: no vllm serve command`);
    for (const c of found) assert.equal(c, expected, file);
  }
});
