"""Where constrained rows are sampled, on the CPU engine (S9, task gmask): the CPU device has
no device sampler, so rows with a grammar mask or logit_bias are sampled on the host whatever
LASTSTAND_GRAMMAR_DEVICE says, and /metrics counts them as host rows (the GPU side of the same
counters, and the device path itself, are tests/test_gpu_grammar.py). Outputs validate with
Python's json: the fallback keeps the constraint."""
import json

import pytest

from e2e_util import Server


@pytest.mark.parametrize("gdev", ["0", "1"])
def test_cpu_engine_samples_constrained_rows_on_the_host(ls_bin, demo_model, gdev):
    with Server(ls_bin, demo_model, env={"LASTSTAND_GRAMMAR_DEVICE": gdev}) as srv:
        assert srv.metric("constrained_rows_host_total") == 0
        st, out = srv.post_json("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False},
            "response_format": {"type": "json_object"}})
        assert st == 200, out
        c = out["choices"][0]
        assert c["finish_reason"] == "stop", c
        assert isinstance(json.loads(c["message"]["content"]), dict)
        n = out["usage"]["completion_tokens"]
        st, out = srv.post_json("/generate", {"text": "The weather is", "sampling_params": {
            "max_new_tokens": 4, "temperature": 0, "logit_bias": {"300": 100}}})
        assert st == 200, out
        assert out["output_ids"] == [300] * 4
        # every sampled token of both requests was a constrained row
        assert srv.metric("constrained_rows_host_total") == n + 4
        assert srv.metric("constrained_rows_device_total") == 0
