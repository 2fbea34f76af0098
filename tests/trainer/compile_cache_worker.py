"""One trainer-like process for test_compile_cache: activate the run's compile cache, compile a
function, save to the store; prints Inductor's cache hits and misses as JSON."""

import json
import sys

import torch
from rlkube.trainer.compile_cache import CompileCache
from torch._dynamo.utils import counters

output_dir, url = sys.argv[1], sys.argv[2]
cache = CompileCache(output_dir, torch.device("cpu"), url)
cache.activate()
compiled = torch.compile(lambda x: torch.sin(x) * 2 + 1)
compiled(torch.randn(64))
cache.save_if_compiled()
print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"], "misses": counters["inductor"]["fxgraph_cache_miss"]}))
