#!/usr/bin/python3
"""Generates audit_events.json: random EventBatch payloads in the map and the
array layouts, written by an independent msgpack writer that picks a random
legal width for every value (fixint/uint8..64/int8..64 hashes, str8/16/32,
bin8/16/32, array16/32, map16/32, float32/64), plus edge cases (empty-string
medium / lora_name, nil or out-of-range block_size, out-of-range token ids,
malformed data_parallel_rank). The expected decode of every payload comes
from Debian's python3-msgpack (msgpack.unpackb) and the rules of kvctl's
output: hashes as uint64 (signed ints keep their 64 bits, bytes give their
trailing 8 bytes), token_ids [] unless every id is an int in 0..2^32-1,
block_size null unless an int in 0..2^32-1, data_parallel_rank null unless an
int in 0..2^31-1. Deterministic (seeded). Run with /usr/bin/python3:

    /usr/bin/python3 gen_audit_events.py > audit_events.json
"""
import json, random, struct, sys
import msgpack

rnd = random.Random(20261129)
def enc_int(v):
    opts=[]
    if 0<=v<=0x7f: opts.append(bytes([v]))
    if -32<=v<0: opts.append(struct.pack("b",v))
    if 0<=v<=0xff: opts.append(b"\xcc"+struct.pack(">B",v))
    if 0<=v<=0xffff: opts.append(b"\xcd"+struct.pack(">H",v))
    if 0<=v<=0xffffffff: opts.append(b"\xce"+struct.pack(">I",v))
    if 0<=v<=2**64-1: opts.append(b"\xcf"+struct.pack(">Q",v))
    if -128<=v<=127: opts.append(b"\xd0"+struct.pack(">b",v))
    if -2**15<=v<2**15: opts.append(b"\xd1"+struct.pack(">h",v))
    if -2**31<=v<2**31: opts.append(b"\xd2"+struct.pack(">i",v))
    if -2**63<=v<2**63: opts.append(b"\xd3"+struct.pack(">q",v))
    return rnd.choice(opts)
def enc_str(s):
    b=s.encode("utf-8","surrogatepass"); n=len(b); o=[]
    if n<32: o.append(bytes([0xa0|n]))
    if n<256: o.append(b"\xd9"+bytes([n]))
    if n<65536: o.append(b"\xda"+struct.pack(">H",n))
    o.append(b"\xdb"+struct.pack(">I",n))
    return rnd.choice(o)+b
def enc_bin(b):
    n=len(b); o=[]
    if n<256: o.append(b"\xc4"+bytes([n]))
    if n<65536: o.append(b"\xc5"+struct.pack(">H",n))
    o.append(b"\xc6"+struct.pack(">I",n))
    return rnd.choice(o)+b
def enc_arr_hdr(n):
    o=[]
    if n<16: o.append(bytes([0x90|n]))
    if n<65536: o.append(b"\xdc"+struct.pack(">H",n))
    o.append(b"\xdd"+struct.pack(">I",n)); return rnd.choice(o)
def enc_map_hdr(n):
    o=[]
    if n<16: o.append(bytes([0x80|n]))
    if n<65536: o.append(b"\xde"+struct.pack(">H",n))
    o.append(b"\xdf"+struct.pack(">I",n)); return rnd.choice(o)
class F32(float): pass
def enc(v):
    if v is None: return b"\xc0"
    if v is True: return b"\xc3"
    if v is False: return b"\xc2"
    if isinstance(v,int): return enc_int(v)
    if isinstance(v,F32): return b"\xca"+struct.pack(">f",v)
    if isinstance(v,float): return b"\xcb"+struct.pack(">d",v)
    if isinstance(v,str): return enc_str(v)
    if isinstance(v,bytes): return enc_bin(v)
    if isinstance(v,(list,tuple)): return enc_arr_hdr(len(v))+b"".join(enc(x) for x in v)
    if isinstance(v,dict): return enc_map_hdr(len(v))+b"".join(enc(k)+enc(x) for k,x in v.items())
    raise TypeError(v)
def rhash():
    c=rnd.random()
    if c<0.45: return rnd.choice([rnd.randint(0,2**64-1), rnd.randint(0,127), rnd.randint(0,2**32), rnd.choice([0,1,127,128,255,256,65535,65536,2**32-1,2**32,2**63-1,2**63,2**64-1])])
    if c<0.7: return rnd.choice([rnd.randint(-2**63,-1), -1,-32,-33,-128,-129,-2**15,-2**31,-2**63])
    return bytes(rnd.getrandbits(8) for _ in range(rnd.choice([8,16,32,32,16,9,1,3,0])))
def rstr():
    return rnd.choice(["GPU","CPU","STORAGE","", "lora-ä", "x"*40, "日本語", "a"*300])
STORED=["block_hashes","parent_block_hash","token_ids","block_size","lora_id","medium","lora_name","extra_keys","group_idx","kv_cache_spec_kind","kv_cache_spec_sliding_window"]
REMOVED=["block_hashes","medium","group_idx"]
def rstored():
    nh=rnd.randint(0,5); bs=rnd.choice([1,16,32,64,128,rnd.randint(1,300)])
    tk=rnd.random()
    if tk<0.6: toks=[rnd.choice([rnd.randint(0,200000),rnd.randint(0,2**32-1),0,127,128,255,65535,65536]) for _ in range(nh*bs if nh*bs<400 else 10)]
    elif tk<0.8: toks=[]
    else: toks=None
    return {"block_hashes":[rhash() for _ in range(nh)], "parent_block_hash": rhash() if rnd.random()<0.5 else None,
            "token_ids":toks, "block_size":bs, "lora_id": rnd.choice([None,None,1,7,2**31-1]),
            "medium": rnd.choice([None,"GPU","CPU","STORAGE",""]), "lora_name": rnd.choice([None,None,"my-lora","ünï",""]),
            "extra_keys": rnd.choice([None,[None]*nh,[["lora",["salt",3]]]+[None]*(max(nh-1,0))]),
            "group_idx": rnd.choice([None,0,1]), "kv_cache_spec_kind": rnd.choice([None,"full_attention","sliding_window"]),
            "kv_cache_spec_sliding_window": rnd.choice([None,4096])}
def rremoved():
    return {"block_hashes":[rhash() for _ in range(rnd.randint(0,6))], "medium": rnd.choice([None,"GPU","CPU"]), "group_idx": rnd.choice([None,0,2])}
def mkevent(layout):
    t=rnd.choice(["BlockStored"]*4+["BlockRemoved"]*2+["AllBlocksCleared","Unknown","BlockUpdated"])
    if t=="BlockStored": f=rstored(); order=STORED
    elif t=="BlockRemoved": f=rremoved(); order=REMOVED
    else: f={"foo":1} if rnd.random()<0.5 else {}; order=list(f)
    if layout=="map":
        m={"type":t}
        req = {"BlockStored":7,"BlockRemoved":2}.get(t,0)
        for i,k in enumerate(order):
            if k in f and (i<req or f[k] is not None):
                if k=="token_ids" and f[k] is None and rnd.random()<0.5: continue  # missing
                m[k]=f[k]
        if rnd.random()<0.2: m["locality"]="LOCAL"
        if rnd.random()<0.2: m["session_id"]="abc"; 
        if rnd.random()<0.1: m["zzz_future"]={"nested":[1,2,{"x":b"\x00"}]}
        if rnd.random()<0.2:  # shuffle keys except type
            items=list(m.items())[1:]; rnd.shuffle(items); m=dict([("type",t)]+items)
        return m
    else:
        # array layouts: truncate to a version length
        if t=="BlockStored": L=rnd.choice([5,6,7,8,9,11,12])
        elif t=="BlockRemoved": L=rnd.choice([1,2,3,4])
        else: L=len(order)
        arr=[t]+[f.get(k) for k in order[:L]]
        if len(arr)<L+1: arr += [None]*(L+1-len(arr))
        if t in ("BlockStored","BlockRemoved") and L>len(order): arr += ["extra"]*(L-len(order))
        return arr
def expect_event(ev):
    if isinstance(ev,dict):
        t=ev.get("type"); g=ev.get
    elif isinstance(ev,list) and ev and isinstance(ev[0],str):
        t=ev[0]; order={"BlockStored":STORED,"BlockRemoved":REMOVED}.get(t,[])
        d={k:ev[i+1] for i,k in enumerate(order) if i+1<len(ev)}; g=d.get
    else: return None
    if t not in ("BlockStored","BlockRemoved","AllBlocksCleared"): return None
    conv=lambda h: (int.from_bytes(h[-8:],"big") if isinstance(h,bytes) else h & (2**64-1))
    ph=g("parent_block_hash") if t=="BlockStored" else None
    toks=g("token_ids") if t=="BlockStored" else None
    return {"type":t,"block_hashes":[conv(h) for h in (g("block_hashes") or [])] if t!="AllBlocksCleared" else [],
            "parent_block_hash": conv(ph) if ph is not None else None,
            "token_ids": toks or [], "block_size": g("block_size") if t=="BlockStored" else None,
            "medium": g("medium") if t!="AllBlocksCleared" else None, "lora_name": g("lora_name") if t=="BlockStored" else None}

U32 = 2**32

def clean_tokens(t):
    if not isinstance(t, list):
        return []
    if all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < U32 for x in t):
        return t
    return []

def clean_block_size(v):
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < U32:
        return v
    return None

def clean_str(v):
    return v if isinstance(v, str) else None

def expect_event2(ev):
    e = expect_event(ev)
    if e is None:
        return None
    if e["type"] == "BlockStored":
        e["token_ids"] = clean_tokens(e["token_ids"])
        e["block_size"] = clean_block_size(e["block_size"])
        e["lora_name"] = clean_str(e["lora_name"])
    e["medium"] = clean_str(e["medium"])
    return e

def expect_batch(payload):
    dec = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    rank = dec[2] if len(dec) > 2 else None
    if not (isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 2**31):
        rank = None
    return {"ts": float(dec[0]), "data_parallel_rank": rank,
            "events": [e for e in (expect_event2(x) for x in dec[1]) if e is not None]}

def stored(**kw):
    m = {"type": "BlockStored", "block_hashes": [1, 2**64 - 1], "parent_block_hash": None,
         "token_ids": [1, 2, 3, 4], "block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": None}
    m.update(kw)
    return m

cases = []
def add(name, batch):
    payload = enc(batch)
    cases.append({"name": name, "payload_hex": payload.hex(), "expect": expect_batch(payload)})

add("edge/medium empty string", [1.5, [stored(medium="")], 0])
add("edge/lora_name empty string", [1.5, [stored(lora_name="")], 0])
add("edge/removed medium empty string", [1.5, [{"type": "BlockRemoved", "block_hashes": [5], "medium": ""}], 0])
add("edge/array medium and lora_name empty", [1.5, [["BlockStored", [9], None, [1, 2], 2, None, "", ""]], 1])
add("edge/block_size nil", [1.5, [stored(block_size=None)], 0])
add("edge/block_size missing", [1.5, [{k: v for k, v in stored().items() if k != "block_size"}], 0])
add("edge/block_size 2^32", [1.5, [stored(block_size=2**32)], 0])
add("edge/block_size 2^32-1", [1.5, [stored(block_size=2**32 - 1)], 0])
add("edge/block_size negative", [1.5, [stored(block_size=-16)], 0])
add("edge/array only hashes", [1.5, [["BlockStored", [7]]], 0])
add("edge/token id 2^32", [1.5, [stored(token_ids=[1, 2**32])], 0])
add("edge/token id 2^32-1", [1.5, [stored(token_ids=[0, 2**32 - 1])], 0])
add("edge/token id negative", [1.5, [stored(token_ids=[1, -1])], 0])
add("edge/token ids nil", [1.5, [stored(token_ids=None)], 0])
add("edge/rank negative", [1.5, [stored()], -1])
add("edge/rank 2^31", [1.5, [stored()], 2**31])
add("edge/rank 2^31-1", [1.5, [stored()], 2**31 - 1])
add("edge/rank string", [1.5, [stored()], "0"])
add("edge/rank float", [1.5, [stored()], 1.0])
add("edge/rank uint64 max", [1.5, [stored()], 2**64 - 1])

N = 300
for it in range(N):
    layout = rnd.choice(["map", "array"])
    evs = [mkevent(layout) for _ in range(rnd.randint(0, 6))]
    ts = rnd.choice([1757500000.25, 1757500000.123456, F32(1.5), F32(1757500000.0), 0.0, 1e-7, 12345])
    form = rnd.choice(["3", "3", "3", "2", "3nil", "4"])
    rank = rnd.choice([0, 1, 3, 255, 1000])
    if form == "3": b = [ts, evs, rank]
    elif form == "3nil": b = [ts, evs, None]
    elif form == "2": b = [ts, evs]
    else: b = [ts, evs, rank, "future"]
    add("random/%d/%s" % (it, layout), b)

json.dump({"generator": "gen_audit_events.py", "cases": cases}, sys.stdout, indent=1, ensure_ascii=True)
sys.stdout.write("\n")
