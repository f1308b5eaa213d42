"""`--model hf:ORG/NAME[@REVISION]` against the local Hub (tests/support/hubserver.py), which serves only a
config.json: the numbers come from that file alone, checked against the family adapters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core import registry
from pipeline.core.errors import RegistryError, SpecError
from pipeline.core.hub_entry import entry_name, parse_ref
from pipeline.core.spec import resolve_spec
from pipeline.planning.planner import plan_capacity
from tests.core.test_architectures import QWEN25_7B_CONFIG
from tests.support.hubserver import LocalHub

ROOT = Path(__file__).parents[2]
TOKEN = "hf_test_gate_token_456"


@pytest.fixture
def hub(monkeypatch, tmp_path, hub_online):
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no saved `hf auth login` token
    registry._hub_entry.cache_clear()
    with LocalHub(tokens={TOKEN}) as h:
        monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
        h.add_commit("Qwen/Qwen2.5-7B-Instruct", {"config.json": json.dumps(QWEN25_7B_CONFIG).encode()})
        yield h
    registry._hub_entry.cache_clear()


def test_plan_from_a_hub_config_alone(hub):
    spec = resolve_spec(model="hf:Qwen/Qwen2.5-7B-Instruct", precision="fp8")
    assert spec.model.name == "hf-Qwen--Qwen2.5-7B-Instruct" and spec.model.revision == "main"
    assert spec.model.architecture == registry.get_model("qwen2.5-7b").architecture
    plan = plan_capacity(spec)
    assert plan.weights_gib_total == plan_capacity(resolve_spec(model="qwen2.5-7b", precision="fp8")).weights_gib_total
    # only config.json was fetched: no weights, no tokenizer
    fetched = {p.rsplit("/", 1)[-1] for m, p, _, _ in hub.requests if "/resolve/" in p}
    assert fetched == {"config.json"}


def test_revision_is_passed_through(hub):
    sha = hub.add_commit("Qwen/Qwen2.5-7B-Instruct", {"config.json": json.dumps(
        {**QWEN25_7B_CONFIG, "num_hidden_layers": 2}).encode()}, ref="v2")
    spec = resolve_spec(model="hf:Qwen/Qwen2.5-7B-Instruct@v2", precision="fp8")
    assert spec.model.revision == "v2" and spec.model.architecture.num_layers == 2
    assert resolve_spec(model=f"hf:Qwen/Qwen2.5-7B-Instruct@{sha}").model.architecture.num_layers == 2


def test_unsupported_architecture_refused_with_the_list(hub):
    hub.add_commit("openai-community/gpt2", {"config.json": b'{"architectures": ["GPT2LMHeadModel"]}'})
    with pytest.raises(RegistryError, match=r"hf:openai-community/gpt2: architecture \['GPT2LMHeadModel'\] is not "
                                            r"supported \(supported: LlamaForCausalLM"):
        resolve_spec(model="hf:openai-community/gpt2")


def test_unsupported_quantization_refused_for_a_hub_model(hub):
    hub.add_commit("mistralai/Mixtral-8x7B-Instruct-v0.1", {"config.json": json.dumps(
        registry.get_model("mixtral-8x7b").architecture.hf_config()).encode()})
    with pytest.raises(SpecError, match="MixtralForCausalLM has no int4_awq on the engine runtime"):
        resolve_spec(model="hf:mistralai/Mixtral-8x7B-Instruct-v0.1", precision="int4_awq", tp=2)


def test_gated_repo_needs_a_token(hub, monkeypatch):
    hub.add_commit("meta-llama/Llama-3.1-8B-Instruct", {"config.json": json.dumps(
        registry.get_model("llama-8b").architecture.hf_config()).encode()}, gated=True)
    with pytest.raises(RegistryError, match="is a gated repo and no Hugging Face token was found.*set HF_TOKEN"):
        resolve_spec(model="hf:meta-llama/Llama-3.1-8B-Instruct")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    registry._hub_entry.cache_clear()
    spec = resolve_spec(model="hf:meta-llama/Llama-3.1-8B-Instruct", precision="fp8")
    assert spec.model.architecture == registry.get_model("llama-8b").architecture
    assert all(TOKEN not in str(r) for r in hub.requests)  # the token travels in a header, never in a path


@pytest.mark.parametrize("ref,match", [
    ("hf:no/such-repo", "repo no/such-repo was not found"),
    ("hf:Qwen/Qwen2.5-7B-Instruct@nope", "revision 'nope' does not exist"),
    ("hf:../etc", "is not a Hub repo id"),
    ("hf:Qwen/Qwen2.5-7B-Instruct@a..b", "is not a branch, tag or commit"),
])
def test_bad_refs_one_line(hub, ref, match):
    with pytest.raises(RegistryError, match=match) as info:
        resolve_spec(model=ref)
    assert "\n" not in str(info.value)


def test_oversized_or_bad_config(hub):
    hub.add_commit("x/huge", {"config.json": b"{" + b" " * (1 << 20) + b"}"})
    with pytest.raises(RegistryError, match="over the 1,048,576-byte limit"):
        resolve_spec(model="hf:x/huge")
    hub.add_commit("x/notjson", {"config.json": b"\xff\xfe"})
    with pytest.raises(RegistryError, match="is not JSON"):
        resolve_spec(model="hf:x/notjson")


@pytest.mark.parametrize("key,value,match", [
    ("num_attention_heads", 0, "field 'num_attention_heads'=0: Input should be greater than 0"),
    ("num_attention_heads", -28, "field 'num_attention_heads'=-28: Input should be greater than 0"),
    ("num_attention_heads", 28.5, "field 'num_attention_heads'=28.5: Input should be a valid integer"),
    ("num_attention_heads", True, "field 'num_attention_heads'=True: Input should be a valid integer"),
    ("num_attention_heads", "28", "field 'num_attention_heads'='28': Input should be a valid integer"),
    ("num_attention_heads", 2048, "field 'num_attention_heads'=2048: Input should be less than or equal to 1024"),
    ("num_key_value_heads", 0, "field 'num_key_value_heads'=0: Input should be greater than 0"),
    ("num_key_value_heads", 5, "num_heads 28 is not a multiple of num_kv_heads 5"),
    ("hidden_size", 1e30, r"field 'hidden_size'=1e\+30: Input should be a valid integer"),
    ("hidden_size", 10**50, "field 'hidden_size'=1000.*: Input should be less than or equal to 131072"),
    ("hidden_size", 3585, "hidden_size 3585 is not a multiple of num_heads 28 and no head_dim is given"),
    ("num_hidden_layers", None, "field 'num_hidden_layers'=None: Input should be a valid integer"),
    ("vocab_size", 10**9, "field 'vocab_size'=1000000000: Input should be less than or equal to 4194304"),
    ("max_position_embeddings", 2**40, "field 'max_position_embeddings'=.*less than or equal to 134217728"),
    ("rope_theta", float("nan"), "field 'rope_theta'=nan: Input should be a finite number"),
    ("rope_theta", float("inf"), "field 'rope_theta'=inf: Input should be a finite number"),
    ("rope_theta", -1.0, "field 'rope_theta'=-1.0: Input should be greater than 0"),
    ("rope_theta", "1e6", "field 'rope_theta'='1e6': Input should be a valid number"),
    ("tie_word_embeddings", "false", "field 'tie_word_embeddings'='false': Input should be a valid boolean"),
    ("head_dim", 0, "field 'head_dim'=0: Input should be greater than 0"),
])
def test_config_numbers_are_type_and_range_checked(hub, key, value, match):
    """Each number of config.json is taken as written (a JSON integer for a count, a finite positive rope_theta),
    within the registry's bounds: one line naming the field, the cached file and the repo."""
    hub.add_commit("x/bad", {"config.json": json.dumps({**QWEN25_7B_CONFIG, key: value}).encode()})
    with pytest.raises(RegistryError, match=f"^--model hf:x/bad: config.json.*{match}") as info:
        resolve_spec(model="hf:x/bad")
    assert "\n" not in str(info.value)
    assert "check the repo, or delete the cached copy " in str(info.value) and "config.json if it is stale" in \
        str(info.value)


def test_config_sliding_window_and_experts_checked(hub):
    base = registry.get_model("mistral-7b").architecture.hf_config()
    for window, match in ((True, "field 'sliding_window'=True: Input should be a valid integer"),
                          (0, "field 'sliding_window'=0: Input should be greater than 0"),
                          ("4096", "field 'sliding_window'='4096': Input should be a valid integer")):
        registry._hub_entry.cache_clear()
        hub.add_commit("x/window", {"config.json": json.dumps({**base, "sliding_window": window}).encode()})
        with pytest.raises(RegistryError, match=match):
            resolve_spec(model="hf:x/window")
    mixtral = registry.get_model("mixtral-8x7b").architecture.hf_config()
    hub.add_commit("x/moe", {"config.json": json.dumps({**mixtral, "num_experts_per_tok": 9}).encode()})
    with pytest.raises(RegistryError, match="experts_per_token 9 exceeds num_experts 8"):
        resolve_spec(model="hf:x/moe")


def test_config_with_absent_head_dim_derives_it(hub):
    assert "head_dim" not in QWEN25_7B_CONFIG
    hub.add_commit("x/nohd", {"config.json": json.dumps({**QWEN25_7B_CONFIG, "head_dim": None}).encode()})
    assert resolve_spec(model="hf:x/nohd").model.architecture.head_dim == 3584 // 28


def test_names():
    assert parse_ref("hf:Qwen/Qwen3-8B") == ("Qwen/Qwen3-8B", "main")
    assert parse_ref("hf:Qwen/Qwen3-8B@abc123") == ("Qwen/Qwen3-8B", "abc123")
    assert entry_name("Qwen/Qwen3-8B") == "hf-Qwen--Qwen3-8B"


def test_invoke_plan_with_a_bad_cached_config_fails_alike_every_run(tmp_path):
    """0 heads: exit 2 with one line (no ZeroDivisionError), and the same line again from the cached copy offline."""
    env = {"PATH": "/usr/bin:/bin", "PIPELINE_ROOT": str(tmp_path), "PIPELINE_CACHE": str(tmp_path / "c"),
           "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    cmd = [sys.executable, "-m", "invoke", "plan", "--model", "hf:x/zero-heads"]
    with LocalHub() as h:
        config = json.dumps({**QWEN25_7B_CONFIG, "num_attention_heads": 0}).encode()
        h.add_commit("x/zero-heads", {"config.json": config})
        first = subprocess.run(cmd, cwd=ROOT, env={**env, "HF_ENDPOINT": h.endpoint}, capture_output=True,
                               text=True, timeout=120)
    again = subprocess.run(cmd, cwd=ROOT, env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                           timeout=120)
    for r in (first, again):
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(
            "error: --model hf:x/zero-heads: config.json field 'num_attention_heads'=0: Input should be greater than "
            f"0; check the repo, or delete the cached copy {tmp_path / 'c'}"), r.stderr
    assert again.stderr == first.stderr


@pytest.mark.slow
def test_invoke_plan_hf_model_against_a_config_only_hub(tmp_path):
    """`invoke plan --model hf:Qwen/Qwen2.5-7B-Instruct` in a fresh process, the Hub serving only config.json."""
    with LocalHub() as h:
        h.add_commit("Qwen/Qwen2.5-7B-Instruct", {"config.json": json.dumps(QWEN25_7B_CONFIG).encode()})
        env = {"PATH": "/usr/bin:/bin", "PIPELINE_ROOT": str(tmp_path), "PIPELINE_CACHE": str(tmp_path / "c"),
               "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": h.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1"}
        r = subprocess.run([sys.executable, "-m", "invoke", "plan", "--model", "hf:Qwen/Qwen2.5-7B-Instruct",
                            "--precision", "fp8", "--json"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["model"] == "hf-Qwen--Qwen2.5-7B-Instruct" and data["fits"]


def test_download_check_compares_family_and_experts():
    from pipeline.core.errors import DownloadError
    from pipeline.stages.download.stage import check_architecture

    mixtral = registry.get_model("mixtral-8x7b").architecture
    cfg = mixtral.hf_config()
    check_architecture(cfg, mixtral, where="w", model="mixtral-8x7b")
    with pytest.raises(DownloadError, match="num_experts=4 but the registry says 8"):
        check_architecture({**cfg, "num_local_experts": 4}, mixtral, where="w", model="mixtral-8x7b")
    with pytest.raises(DownloadError, match="family=mistral but the registry says mixtral"):
        check_architecture({**cfg, "architectures": ["MistralForCausalLM"]}, mixtral, where="w", model="mixtral-8x7b")
    with pytest.raises(DownloadError, match="'GPT2LMHeadModel'.* is not supported"):
        check_architecture({**cfg, "architectures": ["GPT2LMHeadModel"]}, mixtral, where="w", model="mixtral-8x7b")
    for key, value in (("num_attention_heads", 0), ("hidden_size", 1e30), ("rope_theta", float("nan")),
                       ("num_local_experts", True)):
        with pytest.raises(DownloadError, match=f"^w: config.json field '{key}'=.*; check the repo/revision$"):
            check_architecture({**cfg, key: value}, mixtral, where="w", model="mixtral-8x7b")
    qwen = registry.get_model("qwen2.5-7b").architecture
    with pytest.raises(DownloadError, match="^w: config.json field 'seq_length'='8k': expected a positive integer"):
        check_architecture({**QWEN25_7B_CONFIG, "seq_length": "8k"}, qwen, where="w", model="qwen2.5-7b")


def _tokenizer_json(extra: str = "") -> bytes:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {"<unk>": 0, "hello": 1, "world": 2, **({extra: 3} if extra else {})}
    return Tokenizer(WordLevel(vocab, unk_token="<unk>")).to_str().encode()


QWEN25_05B_CONFIG = {**QWEN25_7B_CONFIG, "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
                     "num_hidden_layers": 24, "num_key_value_heads": 2, "tie_word_embeddings": True,
                     "vocab_size": 151936}


def test_hf_draft_pair_shares_the_tokenizer_from_its_files(hub):
    """`--model hf:A --draft hf:B`: numbers of both from their config.json, tokenizer equality from tokenizer.json
    (the padded vocab sizes differ, 152064 vs 151936, as Qwen2.5's do); no weights are fetched."""
    tok = _tokenizer_json()
    hub.add_commit("Qwen/Qwen2.5-7B-Instruct", {"config.json": json.dumps(QWEN25_7B_CONFIG).encode(),
                                                "tokenizer.json": tok})
    hub.add_commit("Qwen/Qwen2.5-0.5B-Instruct", {"config.json": json.dumps(QWEN25_05B_CONFIG).encode(),
                                                  "tokenizer.json": tok})
    spec = resolve_spec(model="hf:Qwen/Qwen2.5-7B-Instruct", draft="hf:Qwen/Qwen2.5-0.5B-Instruct",
                        precision="fp8", runtime="pytorch")
    assert spec.draft_model.architecture == registry.get_model("qwen2.5-0.5b").architecture
    assert spec.model.architecture == registry.get_model("qwen2.5-7b").architecture
    fetched = {p.rsplit("/", 1)[-1] for m, p, _, _ in hub.requests if "/resolve/" in p}
    assert fetched == {"config.json", "tokenizer.json"}


@pytest.mark.parametrize("draft_files, match", [
    ({"tokenizer.json": _tokenizer_json("extra")}, r"speculation\.draft=hf-Qwen--Qwen2\.5-0\.5B-Instruct: its "
                                                   r"tokenizer differs: tokenizer\.json [0-9a-f]{12} \(4 tokens\) vs "
                                                   r"hf-Qwen--Qwen2\.5-7B-Instruct's [0-9a-f]{12} \(3 tokens\)"),
    ({}, r"Qwen/Qwen2\.5-0\.5B-Instruct@main has no tokenizer\.json, so its tokenizer cannot be compared"),
])
def test_hf_draft_pair_with_another_tokenizer_is_refused(hub, draft_files, match):
    hub.add_commit("Qwen/Qwen2.5-7B-Instruct", {"config.json": json.dumps(QWEN25_7B_CONFIG).encode(),
                                                "tokenizer.json": _tokenizer_json()})
    hub.add_commit("Qwen/Qwen2.5-0.5B-Instruct", {"config.json": json.dumps(QWEN25_05B_CONFIG).encode(),
                                                  **draft_files})
    with pytest.raises(SpecError, match=match) as err:
        resolve_spec(model="hf:Qwen/Qwen2.5-7B-Instruct", draft="hf:Qwen/Qwen2.5-0.5B-Instruct", precision="fp8",
                     runtime="pytorch")
    assert "\n" not in str(err.value) and err.value.exit_code == 2


def test_hf_target_with_a_registry_hub_draft_compares_their_files(hub):
    """A registry draft (declared family) against an hf: target: both repos' tokenizer.json decide."""
    hub.add_commit("Qwen/Qwen2.5-7B-Instruct", {"config.json": json.dumps(QWEN25_7B_CONFIG).encode(),
                                                "tokenizer.json": _tokenizer_json()})
    hub.add_commit("Qwen/Qwen2.5-0.5B-Instruct", {"config.json": json.dumps(QWEN25_05B_CONFIG).encode(),
                                                  "tokenizer.json": _tokenizer_json()})
    spec = resolve_spec(model="hf:Qwen/Qwen2.5-7B-Instruct", draft="qwen2.5-0.5b", precision="fp8",
                        runtime="pytorch")
    assert spec.draft_model.name == "qwen2.5-0.5b"
    with pytest.raises(SpecError, match="tiny-llama-draft is generated locally"):
        resolve_spec(model="hf:Qwen/Qwen2.5-7B-Instruct", draft="tiny-llama-draft", precision="fp8",
                     runtime="pytorch")
