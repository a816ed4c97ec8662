"""convert/target.py: the target's sizes and tokenizer, from a GGUF file or an HF directory."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from convert_fixtures import PRESETS, leftovers, read_gguf, run_cli, target_for
from gguf import GGUFValueType, GGUFWriter

from laguna_dflash.convert.gguf import keys as K
from laguna_dflash.convert.converter import convert
from laguna_dflash.convert.errors import ContractError, UserError
from helpers.synthetic import write_drafter, write_target_gguf
from laguna_dflash.convert.target import find_llama_cpp_dir, read_target

XS = PRESETS["xs"]


def test_gguf_target_facts_and_tokenizer(tmp_path: Path) -> None:
    path = write_target_gguf(tmp_path / "t.gguf", n_layer=7, hidden=96, vocab_size=300, name="My Target")
    t = read_target(path)
    assert (t.architecture, t.n_layer, t.hidden_size, t.vocab_size, t.name) == ("laguna", 7, 96, 300, "My Target")
    want = read_gguf(path)
    assert list(t.tokenizer) == [k for k in want.kv_types if k.startswith("tokenizer.")]
    for key, kv in t.tokenizer.items():
        assert (kv.type, *([kv.sub_type] if kv.sub_type is not None else [])) == want.kv_types[key], key
    assert t.tokens()[12] == "〈|MASK|〉".encode()
    assert len(t.tokens()) == 300
    unnamed = write_target_gguf(tmp_path / "plain-target.gguf", name=None)
    assert read_target(unnamed).name == "plain-target"


def _bare_target(path: Path, *, block_count: bool = True, tokens: bool = True) -> Path:
    w = GGUFWriter(path, "laguna")
    if block_count:
        w.add_uint32("laguna.block_count", 4)
    w.add_uint32("laguna.embedding_length", 64)
    if tokens:
        w.add_key_value("tokenizer.ggml.tokens", [f"t{i}" for i in range(256)], GGUFValueType.ARRAY,
                        GGUFValueType.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


def test_gguf_target_missing_facts(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=r"t1\.gguf: laguna\.block_count: expected a positive integer, found noth"):
        read_target(_bare_target(tmp_path / "t1.gguf", block_count=False))
    with pytest.raises(ContractError, match=r"t2\.gguf: tokenizer\.ggml\.tokens: expected the target's vocabulary"):
        read_target(_bare_target(tmp_path / "t2.gguf", tokens=False))
    assert read_target(_bare_target(tmp_path / "t3.gguf")).vocab_size == 256


def _hf_target_dir(path: Path, **over: object) -> Path:
    path.mkdir()
    cfg = {"architectures": ["LagunaForCausalLM"], "model_type": "laguna", "num_hidden_layers": 4,
           "hidden_size": 64, "vocab_size": 256, **over}
    (path / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))  # None: absent
    return path


def _fake_vocab_step(vocab_size: int = 256):
    calls: list[Path] = []

    def step(hf_dir: Path, out: Path) -> None:
        calls.append(hf_dir)
        write_target_gguf(out, vocab_size=vocab_size, name="From Vocab Step")

    return step, calls


def test_hf_target_with_injected_tokenizer_step(tmp_path: Path) -> None:
    hf = _hf_target_dir(tmp_path / "Tiny-Laguna")
    step, calls = _fake_vocab_step()
    t = read_target(hf, vocab_step=step)
    assert calls == [hf]
    assert (t.n_layer, t.hidden_size, t.vocab_size, t.name) == (4, 64, 256, "From Vocab Step")
    assert t.tokenizer["tokenizer.ggml.model"].value == b"gpt2"
    drafter = write_drafter(tmp_path / "d", **XS)
    summary = convert(drafter, t, tmp_path / "o.gguf")
    out = read_gguf(summary.out)
    reference = read_gguf(target_for(XS, tmp_path / "ref.gguf"))
    assert out.kv["tokenizer.ggml.tokens"] == reference.kv["tokenizer.ggml.tokens"]
    assert out.kv[K.TARGET_NAME] == "From Vocab Step"


@pytest.mark.parametrize("over,vocab,fragment", [
    ({"num_hidden_layers": None}, 256, "config.json: num_hidden_layers: expected a positive integer, found nothing"),
    ({"hidden_size": "64"}, 256, 'config.json: hidden_size: expected a positive integer, found "64"'),
    ({}, 200, "config.json: vocab_size: expected 200 (tokens in the target's tokenizer), found 256"),
    ({"architectures": ["DFlashLagunaForCausalLM"]}, 256,
     "config.json: architectures: expected the target model (e.g. LagunaForCausalLM), "
     'found ["DFlashLagunaForCausalLM"]'),
], ids=["no-layers", "string-hidden", "vocab-vs-tokens", "drafter-as-target"])
def test_hf_target_config_checks(tmp_path: Path, over: dict, vocab: int, fragment: str) -> None:
    hf = _hf_target_dir(tmp_path / "hf", **over)
    step, _ = _fake_vocab_step(vocab)
    with pytest.raises(ContractError) as e:
        read_target(hf, vocab_step=step)
    assert fragment in str(e.value)


def test_hf_target_pairing_is_checked(tmp_path: Path) -> None:
    from laguna_dflash.convert.converter import prepare

    step, _ = _fake_vocab_step()
    t = read_target(_hf_target_dir(tmp_path / "hf", num_hidden_layers=6), vocab_step=step)
    with pytest.raises(ContractError, match=r"dflash_config\.num_target_layers: expected 6"):
        prepare(write_drafter(tmp_path / "d", **XS), t)


def test_finding_llama_cpp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAGUNA_LLAMA_CPP_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="LAGUNA_LLAMA_CPP_DIR=.*nowhere: expected a llama.cpp tree"):
        find_llama_cpp_dir()
    monkeypatch.delenv("LAGUNA_LLAMA_CPP_DIR")
    monkeypatch.setenv("LAGUNA_DFLASH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UserError, match="cannot find llama.cpp's convert_hf_to_gguf.py"):
        find_llama_cpp_dir()
    trees = []
    for i, key in enumerate(["aaa", "bbb"]):
        tree = tmp_path / "cache" / "src" / key / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
        tree.mkdir(parents=True)
        (tree / "convert_hf_to_gguf.py").write_text("")
        os.utime(tree, (time.time() - 100 + 50 * i,) * 2)
        trees.append(tree)
    assert find_llama_cpp_dir() == trees[1]
    os.utime(trees[0], (time.time() + 100,) * 2)
    assert find_llama_cpp_dir() == trees[0]
    monkeypatch.setenv("LAGUNA_LLAMA_CPP_DIR", str(trees[1]))
    assert find_llama_cpp_dir() == trees[1]


def test_failing_vocab_step_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "llama.cpp"
    tree.mkdir()
    (tree / "convert_hf_to_gguf.py").write_text(
        "import sys\nprint('BPE pre-tokenizer was not recognized', file=sys.stderr)\nsys.exit(1)\n")
    monkeypatch.setenv("LAGUNA_LLAMA_CPP_DIR", str(tree))
    hf = _hf_target_dir(tmp_path / "hf")
    d = write_drafter(tmp_path / "d", **XS)
    res = run_cli("convert", d, "--target", hf, "-o", tmp_path / "o.gguf")
    assert res.code == 2
    assert res.stderr.strip().endswith("failed: BPE pre-tokenizer was not recognized")
    assert leftovers(tmp_path) == []


# --------------------------------------------------------------------------- the real llama.cpp step

# run with the real tree and its gguf-py on PYTHONPATH, as the real script finds them beside itself
_WRAPPER = '''\
"""Run llama.cpp's converter, told that our home-made byte-level BPE pre-tokenizes like GPT-2."""
import runpy, sys
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv[0] = {real!r} + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def test_hf_target_through_vendored_llama_cpp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: a tiny HF Laguna target dir, its tokenizer read by the vendored convert_hf_to_gguf.py."""
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    monkeypatch.delenv("LAGUNA_LLAMA_CPP_DIR", raising=False)
    try:
        real = find_llama_cpp_dir()
    except UserError:
        pytest.skip("no vendored llama.cpp (run laguna-run setup --source-dir)")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = tmp_path / "Tiny-Laguna-HF"
    hf.mkdir()
    specials = ["〈|PAD|〉", "〈|UNK|〉", "〈|EOS|〉"] + [f"<special{i}>" for i in range(3, 16)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["a tiny corpus for a tiny tokenizer"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="〈|EOS|〉", pad_token="〈|PAD|〉"
                                         ).save_pretrained(hf)
    preset = dict(XS, vocab_size=320)  # a byte-level BPE needs 256 byte tokens + specials
    cfg = transformers.LagunaConfig(vocab_size=preset["vocab_size"], hidden_size=XS["hidden"], num_hidden_layers=4,
                                    intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    cfg.architectures = ["LagunaForCausalLM"]
    cfg.save_pretrained(hf)

    wrapper = tmp_path / "llama.cpp-gpt2-pre"
    wrapper.mkdir()
    (wrapper / "convert_hf_to_gguf.py").write_text(_WRAPPER.format(real=str(real)))
    monkeypatch.setenv("LAGUNA_LLAMA_CPP_DIR", str(wrapper))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(real), str(real / "gguf-py")]))

    drafter = write_drafter(tmp_path / "d", **preset)
    out = tmp_path / "o.gguf"
    res = run_cli("convert", drafter, "--target", hf, "-o", out, "-q")
    assert res.code == 0, res.stderr
    g = read_gguf(out)
    assert g.kv["tokenizer.ggml.model"] == "gpt2" and g.kv["tokenizer.ggml.pre"] == "gpt-2"
    tokens = g.kv["tokenizer.ggml.tokens"]
    assert len(tokens) == preset["vocab_size"]  # padded by llama.cpp to the config's vocab_size
    assert tokens[:3] == ["〈|PAD|〉", "〈|UNK|〉", "〈|EOS|〉"]
    assert g.kv[K.TARGET_N_LAYER] == 4
