# run_chains: a file of another run (other variables/shapes/chain count) -> error naming file+variable; nothing overwritten
import os, shutil, hashlib, jax, jax.numpy as jnp, numpy as np
from jaxstow import io
from jaxstow.errors import JaxstowError
D = "/tmp/probe-audit25/rc"; shutil.rmtree(D, ignore_errors=True); os.makedirs(D)
def mk(chains=2, shape=(3,), name="x", seed=0):
    def start(): return {"key": jax.random.key_data(jax.random.split(jax.random.key(seed), chains)), "p": jnp.zeros((chains,) + shape)}
    def step(s, t):
        ks = jax.vmap(jax.random.split)(jax.random.wrap_key_data(s["key"]))
        p = s["p"] + jax.vmap(lambda k: jax.random.normal(k, shape))(ks[:, 1])
        return {"key": jax.random.key_data(ks[:, 0]), "p": p}, {name: p}, jnp.ones((chains,), bool)
    return start, step
P = f"{D}/a.h5"
s, st = mk(); base = io.run_chains(P, s, st, num_steps=50, checkpoint_every=10)
h = lambda: hashlib.sha256(open(P, "rb").read()).hexdigest(); h0 = h()
for label, kw in [("other var", dict(name="y")), ("other shape", dict(shape=(4,))), ("other chains", dict(chains=3)), ("other seed (no identity)", dict(seed=1))]:
    s, st = mk(**kw)
    try:
        r = io.run_chains(P, s, st, num_steps=50, checkpoint_every=10); print("[NO ERROR]", label, {k: v.shape for k, v in r.items()}, "equal to base:", all(np.array_equal(r[k], base[k]) for k in base if k in r))
    except JaxstowError as e: print("[ok]", label, type(e).__name__, str(e)[:300])
    except Exception as e: print("[FOREIGN]", label, type(e).__name__, str(e)[:300])
    print("  unchanged" if h() == h0 else "  !! FILE CHANGED")
