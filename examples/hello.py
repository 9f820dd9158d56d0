"""A first tray program: tasks, a tree reduce over NumPy arrays, and an
actor. It runs on real processes on this machine; with ``--sim`` on a
simulated three-node cluster instead (deterministic, virtual time)."""

import sys

import numpy as np

import tray

if "--sim" in sys.argv:
    tray.init(backend="sim", num_nodes=3, num_cpus=4, seed=7)
else:
    tray.init()


@tray.remote
def add(a, b):
    return a + b


data = [tray.put(np.ones(1000)) for _ in range(16)]
while len(data) > 1:  # tree reduce: each add runs as soon as its inputs exist
    data.append(add.remote(data.pop(0), data.pop(0)))
print("sum of 16 arrays of ones:", tray.get(data[0]).sum())


@tray.remote
class Counter:
    def __init__(self):
        self.value = 0

    def increment(self):
        self.value += 1
        return self.value


counter = Counter.remote()
print("counter:", tray.get([counter.increment.remote() for _ in range(5)]))
print("nodes:", [node["NodeID"][:8] for node in tray.nodes()],
      "backend:", "sim" if "--sim" in sys.argv else "local")
tray.shutdown()
