// harness.mjs - starts a real `cairn serve` on a free loopback port for the end-to-end tests.
//
// CAIRN_BIN names the binary and CAIRN_TMP a scratch folder (ctest sets both); the tiny synthetic
// model is made there once. Every wait is bounded: a server that does not say it is ready within
// 60 s fails the test, and stop() kills it after 10 s at most.
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import path from 'node:path';

export const BIN = process.env.CAIRN_BIN || 'build/cairn';
export const TMP = process.env.CAIRN_TMP || 'build/tmp';

export function tinyModel() {
  const dir = path.join(TMP, 'server-e2e', 'tiny');
  if (!existsSync(path.join(dir, 'config.json'))) {
    mkdirSync(path.dirname(dir), { recursive: true });
    execFileSync(BIN, ['make-model', '--preset', 'tiny', '--out', dir], { stdio: 'ignore' });
  }
  return dir;
}

// Starts `cairn serve --model MODEL --port 0 ...args`, its environment the process's with CAIRN_LOG
// at info and env's entries set (or, where a value is null, removed); resolves to
// { url, port, proc, log(), stop() }.
export function serveModel(model, args = [], env = {}) {
  const penv = { ...process.env, CAIRN_LOG: 'info' };
  for (const [k, v] of Object.entries(env)) {
    if (v === null || v === undefined) delete penv[k];
    else penv[k] = v;
  }
  const proc = spawn(BIN, ['serve', '--model', model, '--port', '0', ...args], {
    env: penv,
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error('server did not start in 60 s:\n' + log));
    }, 60000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/serving \S+ on (http:\/\/[^\s]+):(\d+)/);
      if (m && timer) {
        clearTimeout(timer);
        const port = Number(m[2]);
        resolve({
          url: `http://127.0.0.1:${port}`,
          port,
          proc,
          log: () => log,
          stop: () => stopProc(proc),
        });
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code}:\n${log}`));
    });
  });
}

// The tiny model on one thread: serveModel(<tiny>, ['--threads', '1', ...args], env).
export function startServer(args = [], env = {}) {
  return serveModel(tinyModel(), ['--threads', '1', ...args], env);
}

function stopProc(proc) {
  return new Promise((resolve) => {
    if (proc.exitCode !== null) return resolve(proc.exitCode);
    const t = setTimeout(() => proc.kill('SIGKILL'), 10000);
    proc.removeAllListeners('exit');
    proc.on('exit', (code, sig) => {
      clearTimeout(t);
      resolve(code ?? sig);
    });
    proc.kill('SIGTERM');
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls cond() every 50 ms for at most ms milliseconds.
export async function waitFor(cond, ms = 20000, what = 'condition') {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await cond()) return;
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}`);
}

// A prompt of about n words from a fixed vocabulary (deterministic).
export function longText(words, seed = 1) {
  const vocab = 'the quick brown fox jumps over lazy dog model state layer token cache'.split(' ');
  let x = seed;
  const out = [];
  for (let i = 0; i < words; i++) {
    x = (x * 1103515245 + 12345) % 2147483648;
    out.push(vocab[x % vocab.length]);
  }
  return out.join(' ');
}
