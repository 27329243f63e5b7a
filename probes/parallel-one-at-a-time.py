"""Probe: the parallel gate's sparse server (four slots, a KV stream each) asked its prompts one at
a time, each output compared with the gate's alone (B1) and under-load (B4) outputs.

Usage: python3 probes/parallel-one-at-a-time.py RESULTS_DIR [BIN_DIR]
  RESULTS_DIR  a run of `llama-sparse gate gates/parallel.yaml` (its report.json and samples/)
  BIN_DIR      the binaries it ran (default build/patched/bin)
"""
import json, os, subprocess, time, urllib.request, sys
run = sys.argv[1]
bins = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else 'build/patched/bin')
samples = json.load(open(os.path.join(run, 'samples', 'smollm2-135m-4096.json')))
r = json.load(open(os.path.join(run, 'report.json')))
alone = {s['index']: s['output'] for res in r['results'] if res['arm']=='sparse-default' and res['batch']==1 for s in res['samples']}
under = {s['index']: s['output'] for res in r['results'] if res['arm']=='sparse-default' and res['batch']==4 for s in res['samples']}
port = 34999
srv = subprocess.Popen([os.path.join(bins, 'llama-server'),'-m',os.path.expanduser('~/.cache/llama-sparse/models/SmolLM2-135M-Instruct.Q4_1.gguf'),'-c','16896','-np','4','--seed','42','--no-warmup','--no-webui','-fa','on','-ctk','f16','-ctv','f16','--sparse-attn','on','--host','127.0.0.1','--port',str(port)], stdout=open(os.path.join(run, 'one-at-a-time-server.log'), 'w'), stderr=subprocess.STDOUT, env={**os.environ, 'LD_LIBRARY_PATH': bins})
try:
    for _ in range(120):
        try:
            if urllib.request.urlopen(f'http://127.0.0.1:{port}/health').status == 200: break
        except Exception: time.sleep(1)
    for s in samples:
        body = json.dumps({'prompt': s['prompt'], 'n_predict': 64, 'temperature': 0.0, 'top_k': 1, 'cache_prompt': True, 'seed': 42}).encode()
        out = json.load(urllib.request.urlopen(urllib.request.Request(f'http://127.0.0.1:{port}/completion', data=body, headers={'Content-Type':'application/json'})))['content']
        i = s['index']
        print(i, 'same as alone' if out == alone[i] else 'DIFFERS from alone', '| same as under load' if out == under[i] else '', repr(out[:80]), flush=True)
finally:
    srv.terminate()
