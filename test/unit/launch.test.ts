import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT } from '../../client/processes';

// launch.sh: `gpu --dry-run` and `resume --dry-run` print every command (bin/launch-gpu.sh) and run none; Node's version is checked first.
function launch(args: string[], env: Record<string, string> = {}): string {
  const dir = mkdtempSync(join(tmpdir(), 'halo-launch-'));
  try {
    return execFileSync(join(REPO_ROOT, 'launch.sh'), args, {
      cwd: REPO_ROOT,
      env: { ...process.env, HALO_LORA_RANK: '', HALO_POLICY_API_KEY: '', HALO_LAUNCH_STATE: join(dir, 'state.env'), ...env },
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
  lineWith(out, /python3 -m venv \.venv-vllm$/);
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
  assert.match(serve, / --api-key "\$HALO_POLICY_API_KEY"/);
  assert.equal(spawnSync('bash', ['-n', '-c', serve]).status, 0, 'the printed command is valid bash');

  const upLine = lineWith(out, /npx halo up$/);
  assert.match(upLine, /HALO_MODEL=Qwen\/Qwen3-VL-8B-Instruct /, 'the learner holds the model vLLM serves');
  assert.match(upLine, /HALO_LORA_RANK=128 /);
  const train = lineWith(out, /npx halo train/);
  assert.match(train, /--config configs\/grpo-real\.yaml --lr 2e-5$/, 'extra arguments go to halo train');
  const order = [/vllm serve/, /hf download/, /npx halo up/, /npx halo train/].map((re) => out.split('\n').findIndex((l) => re.test(l)));
  assert.ok(order[1] < order[0] && order[0] < order[2] && order[2] < order[3], 'download, vLLM, stack, training');
});

test('the default LoRA rank gives --max-lora-rank 64 and no --api-key; a rank vLLM cannot serve is refused', () => {
  const serve = lineWith(launch(['--skip-setup', 'gpu', '--dry-run']), /vllm serve/);
  assert.match(serve, / --max-lora-rank 64 /);
  assert.doesNotMatch(serve, /--api-key/);
  assert.throws(() => launch(['--skip-setup', 'gpu', '--dry-run'], { HALO_LORA_RANK: '1024' }), /largest LoRA rank/);
});

test('./launch.sh resume --dry-run brings back what was recorded, never the local default job', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-launch-state-'));
  try {
    const state = join(dir, 'state.env');
    writeFileSync(state, 'HALO_LAUNCH_MODE=gpu\nHALO_GPU_MODEL=Qwen/Qwen3-VL-8B-Instruct\nHALO_LORA_RANK=32\nHALO_VLLM_PORT=8001\n');
    const gpu = launch(['resume', '--dry-run'], { HALO_LAUNCH_STATE: state });
    assert.match(lineWith(gpu, /vllm serve/), / --port 8001 .* --max-lora-rank 64 /);
    assert.match(lineWith(gpu, /npx halo up$/), /HALO_MODEL=Qwen\/Qwen3-VL-8B-Instruct HALO_LORA_RANK=32 /);
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

test('./launch.sh without Node.js >= 20 stops at once and says how to get it', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-old-node-'));
  try {
    writeFileSync(join(dir, 'node'), '#!/bin/sh\necho v12.22.9\n', { mode: 0o755 });
    const r = spawnSync(join(REPO_ROOT, 'launch.sh'), ['--skip-setup', 'status', 'x'], {
      cwd: REPO_ROOT,
      env: { ...process.env, PATH: `${dir}:${process.env.PATH}` },
      encoding: 'utf8',
    });
    assert.equal(r.status, 1);
    assert.match(r.stderr, /Node\.js >= 20 is needed \(found: v12\.22\.9\)/);
    assert.match(r.stderr, /deb\.nodesource\.com\/setup_22\.x/);
    assert.match(r.stderr, /nvm install 22/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
