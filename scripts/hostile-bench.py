#!/usr/bin/env python3
# Hostile HTTP clients against a real `inferq batch-api` (issue 48): RSS with 5,000 idle
# connections, RSS growth under 50 concurrent unauthenticated 15 MB bodies, and the connections
# still open 60 s after 1,000 slowloris clients start (default 30 s header-read timeout).
# Starts its own redis-server on a free port. Usage: scripts/hostile-bench.py target/release/inferq
# With `--sim target/release/inferq-dev` the same clients (but the bodies) go to the simulator
# gateway (`inferq-dev sim`), whose listener is bounded alike.
# (needs `ulimit -n` above 6,000 and `ss`). Prints figures; takes about 70 s.
import asyncio, os, socket, subprocess, sys, time, json
def free():
    s=socket.socket(); s.bind(("127.0.0.1",0)); p=s.getsockname()[1]; s.close(); return p
def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS:"): return int(l.split()[1])/1024
def nconn(pid, port):
    out=subprocess.run(["ss","-Htn","state","established",f"( sport = :{port} )"],capture_output=True,text=True).stdout
    return len([l for l in out.splitlines() if l.strip()])
rp=free(); import tempfile; d=tempfile.mkdtemp(prefix="hostile-bench-"); os.makedirs(d,exist_ok=True)
redis=subprocess.Popen(["redis-server","--port",str(rp),"--save","","--appendonly","no","--dir",d],stdout=subprocess.DEVNULL)
time.sleep(0.5)
json.dump({"url":f"redis://127.0.0.1:{rp}","queues":[{"queue_name":"q","igw_base_url":"http://127.0.0.1:9"}]},open(f"{d}/t.json","w"))
json.dump({"sk-hostile-bench-0123456789":"t"},open(f"{d}/k.json","w"))
port=free()
sim=sys.argv[1]=="--sim"
if sim: api=subprocess.Popen([sys.argv[2],"sim","--listen",f"127.0.0.1:{port}"],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
else: api=subprocess.Popen([sys.argv[1],"batch-api","--transport-config-file",f"{d}/t.json","--listen",f"127.0.0.1:{port}","--files-dir",f"{d}/files","--api-keys-file",f"{d}/k.json","--max-line-bytes","20000000"],stderr=subprocess.DEVNULL)
time.sleep(2)
pid=api.pid
async def slowloris(n):
    async def one():
        try:
            r,w=await asyncio.open_connection("127.0.0.1",port)
            w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"); await w.drain()
            while True:
                await asyncio.sleep(10); w.write(b"X-a: b\r\n"); await w.drain()
        except Exception: return
    ts=[asyncio.create_task(one()) for _ in range(n)]
    base=rss(pid); await asyncio.sleep(1); print(f"slowloris: {n} clients started, open={nconn(pid,port)}, rss={rss(pid):.1f} MiB (idle base {base:.1f})", flush=True)
    await asyncio.sleep(59)
    print(f"slowloris: open connections 60 s after start: {nconn(pid,port)}", flush=True)
    for t in ts: t.cancel()
async def idle(n):
    base=rss(pid); cs=[]
    for _ in range(n):
        cs.append(await asyncio.open_connection("127.0.0.1",port))
    await asyncio.sleep(2)
    print(f"idle: {n} connections open={nconn(pid,port)}, rss {base:.1f} -> {rss(pid):.1f} MiB (+{rss(pid)-base:.1f})", flush=True)
    for r,w in cs: w.close()
async def bodies(n):
    await asyncio.sleep(1)
    base=rss(pid); peak=base
    body=b"x"*15_000_000
    async def one():
        try:
            r,w=await asyncio.open_connection("127.0.0.1",port)
            w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15000000\r\n\r\n")
            w.write(body); await w.drain()
            line=await r.readline(); return line
        except Exception as e: return repr(e)[:40]
    ts=[asyncio.create_task(one()) for _ in range(n)]
    while not all(t.done() for t in ts):
        peak=max(peak,rss(pid)); await asyncio.sleep(0.02)
    res=[t.result() for t in ts]
    print(f"bodies: {n} unauthenticated 15 MB bodies: rss {base:.1f} -> peak {peak:.1f} MiB (+{peak-base:.1f}); answers {set(map(str,res))}", flush=True)
async def main():
    await idle(5000)
    if not sim: await bodies(50)
    await slowloris(1000)
asyncio.run(main())
api.kill(); redis.kill()
