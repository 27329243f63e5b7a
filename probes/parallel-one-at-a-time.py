"""Probe: the parallel gate's sparse server (four slots, a KV stream each) asked its prompts one at
a time, each output compared with the gate's alone (B1) and under-load (B4) outputs.

Usage: python3 probes/parallel-one-at-a-time.py RESULTS_DIR [ARM]
  RESULTS_DIR  a run of `llama-sparse gate gates/parallel.yaml` (its report.json, samples/, logs/)
  ARM          the sparse arm (default sparse-default)
The server is started with the command the gate logged for ARM at B4 (first line of its log),
on another port.
"""
import glob, json, os, shlex, subprocess, sys, time, urllib.request

run = sys.argv[1]
arm = sys.argv[2] if len(sys.argv) > 2 else 'sparse-default'
samples = json.load(open(os.path.join(run, 'samples', 'smollm2-135m-4096.json')))
report = json.load(open(os.path.join(run, 'report.json')))
outputs = {res['batch']: {s['index']: s['output'] for s in res['samples']} for res in report['results'] if res['arm'] == arm}
alone, under = outputs[1], outputs[4]

log = glob.glob(os.path.join(run, 'logs', f'niah-{arm}-*-B4.log'))[0]
cmd = shlex.split(open(log).readline().removeprefix('$ '))
port = 34999
cmd[cmd.index('--port') + 1] = str(port)
bins = os.path.dirname(cmd[0])
srv = subprocess.Popen(cmd, stdout=open(os.path.join(run, 'one-at-a-time-server.log'), 'w'), stderr=subprocess.STDOUT,
                       env={**os.environ, 'LD_LIBRARY_PATH': bins})
try:
    for _ in range(120):
        try:
            if urllib.request.urlopen(f'http://127.0.0.1:{port}/health').status == 200:
                break
        except Exception:
            time.sleep(1)
    for s in samples:
        body = json.dumps({'prompt': s['prompt'], 'n_predict': 64, 'temperature': 0.0, 'top_k': 1, 'cache_prompt': True, 'seed': 42}).encode()
        req = urllib.request.Request(f'http://127.0.0.1:{port}/completion', data=body, headers={'Content-Type': 'application/json'})
        out = json.load(urllib.request.urlopen(req))['content']
        i = s['index']
        print(i, 'same as alone' if out == alone[i] else 'DIFFERS from alone', '| same as under load' if out == under[i] else '',
              repr(out[:80]), flush=True)
finally:
    srv.terminate()
