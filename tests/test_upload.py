"""`laguna-gguf upload` and its model card, against a loopback stand-in for the Hub API."""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from laguna_dflash.convert.gguf import keys as K  # noqa: E402
from laguna_dflash.convert import model_card, upload as up  # noqa: E402
from laguna_dflash.convert.errors import UserError  # noqa: E402
from laguna_dflash.convert.model_card import BenchResults, BenchRow, GGUFInfo, build_model_card, pair_target, parse_bench  # noqa: E402
from hub_standin import HubStandIn  # noqa: E402

# Deliberately not shaped like a real token (hf_...), so only exact-token scrubbing can hide it.
TOKEN = "standin-secret-7f3a9c2e41"
XS_IDS = [1, 13, 25, 33, 39]
S_IDS = [1, 10, 19, 29, 38, 47]


# --------------------------------------------------------------------------- fake GGUFs


def write_drafter(
    path: Path,
    *,
    source: str | None = "poolside/Laguna-XS-2.1-DFlash",
    license: str | None = "apache-2.0",
    target_name: str | None = "Laguna-XS.2.1",
    target_n_layer: int | None = 40,
    layer_ids: list[int] = XS_IDS,
    n_embd: int = 64,
    ftype: int = 7,
    seed: int = 0,
) -> Path:
    """A tiny drafter GGUF with the keys our converter writes (SPEC §5a), not a working model."""
    arch = K.ARCH
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.name", "Laguna XS 2.1 DFlash")
    w.add_string("general.basename", "Laguna-XS-2.1-DFlash")
    w.add_uint32("general.file_type", ftype)
    if source:
        w.add_string("general.source.huggingface.repository", source)
    if license:
        w.add_string("general.license", license)
    w.add_bool(K.DFLASH_LAGUNA, True)
    w.add_uint32(K.BLOCK_SIZE, 16)
    w.add_uint32(K.MASK_TOKEN_ID, 12)
    w.add_array(K.TARGET_LAYER_IDS, layer_ids)
    w.add_uint32(K.BLOCK_COUNT, 2)
    w.add_uint32(K.EMBEDDING_LENGTH, n_embd)
    if target_name:
        w.add_string(K.TARGET_NAME, target_name)
    if target_n_layer is not None:
        w.add_uint32(K.TARGET_N_LAYER, target_n_layer)
    rng = np.random.default_rng(seed)
    for name in ("dflash_fc.weight", "blk.0.attn_q.weight", "blk.1.attn_q.weight"):
        m = rng.standard_normal((n_embd, n_embd)).astype(np.float32)
        if ftype == 7:
            w.add_tensor(name, gguf.quants.quantize(m, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, m)
    for name in ("output_norm.weight", "dflash_hidden_norm.weight"):
        w.add_tensor(name, np.ones(n_embd, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_target(path: Path, *, n_layer: int = 40, n_embd: int = 64) -> Path:
    w = gguf.GGUFWriter(str(path), "laguna")
    w.add_string("general.name", "Laguna XS 2.1")
    w.add_uint32("general.file_type", 0)
    w.add_uint32("laguna.block_count", n_layer)
    w.add_uint32("laguna.embedding_length", n_embd)
    w.add_tensor("token_embd.weight", np.zeros((8, n_embd), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sha(path_or_bytes: Path | bytes) -> str:
    data = path_or_bytes.read_bytes() if isinstance(path_or_bytes, Path) else path_or_bytes
    return hashlib.sha256(data).hexdigest()


def front_matter(card: str) -> dict:
    yaml = pytest.importorskip("yaml")
    assert card.startswith("---\n")
    head = card.split("\n---\n", 1)[0][4:]
    return yaml.safe_load(head)


def info(**kw) -> GGUFInfo:
    base = dict(
        filename="drafter-Q8_0.gguf",
        size=123456,
        sha256="ab" * 32,
        architecture=K.ARCH,
        file_type=7,
        tensor_types=(("Q8_0", 49), ("F32", 23)),
        block_count=5,
        embedding_length=2048,
        laguna=True,
        block_size=16,
        mask_token_id=12,
        target_layer_ids=tuple(XS_IDS),
        target_name="Laguna-XS.2.1",
        target_n_layer=40,
        source_repo="poolside/Laguna-XS-2.1-DFlash",
        license="apache-2.0",
    )
    base.update(kw)
    return GGUFInfo(**base)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The stand-in, with the process pointed at it and a known token in HF_TOKEN."""
    server = HubStandIn(token=TOKEN).start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for var in ("HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    import huggingface_hub.constants as hc
    import huggingface_hub.utils._detect_agent as agent

    monkeypatch.setattr(hc, "HF_TOKEN_PATH", str(tmp_path / "no-saved-token"))
    # huggingface_hub fetches a public agent registry once per process for its user-agent header, from the
    # endpoint it saw at import time; pin it so no test depends on that request or writes into HF_HOME.
    monkeypatch.setattr(hc, "AGENT_HARNESSES_PATH", str(tmp_path / "agent-harnesses.json"), raising=False)
    monkeypatch.setattr(agent, "_registry", {"standardEnvVars": [], "harnesses": {}}, raising=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cli():
    app = typer.Typer()
    up.register(app)

    @app.command("noop", hidden=True)
    def _noop() -> None:  # a second command keeps typer from flattening `upload` into the app itself
        pass

    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["upload", *map(str, args)])


@pytest.fixture
def drafter(tmp_path) -> Path:
    return write_drafter(tmp_path / "Laguna-XS-2.1-DFlash-Q8_0.gguf")


def assert_no_token(*texts: str) -> None:
    for t in texts:
        assert TOKEN not in t


# --------------------------------------------------------------------------- the card (pure)


def test_card_front_matter_and_files():
    card = build_model_card("me/Laguna-XS-2.1-DFlash-GGUF", [info()])
    meta = front_matter(card)
    assert meta["base_model"] == "poolside/Laguna-XS-2.1-DFlash"
    assert meta["license"] == "apache-2.0"
    assert {"gguf", "speculative-decoding", "dflash", "laguna"} <= set(meta["tags"])
    assert "# Laguna-XS-2.1-DFlash-GGUF" in card
    row = next(line for line in card.splitlines() if line.startswith("| `drafter-Q8_0.gguf`"))
    assert "Laguna DFlash drafter (`dflash-draft`)" in row
    assert "Q8_0 (49 Q8_0, 23 F32 tensors)" in row
    assert "120.6 KiB" in row and "ab" * 32 in row


def test_card_pairs_with_official_xs_target_and_gives_commands():
    card = build_model_card("me/x", [info()])
    assert "checked against `Laguna-XS.2.1` (a 40-layer target)" in card
    assert "https://huggingface.co/poolside/Laguna-XS-2.1-GGUF" in card
    assert "laguna-run -m TARGET.gguf -md drafter-Q8_0.gguf" in card and "--n-max 4" in card
    # ik_llama.cpp takes the depth inside the stage and rejects the legacy --draft-max
    assert "llama-server -m TARGET.gguf -md drafter-Q8_0.gguf --spec-type dflash:n_max=4\n" in card
    assert not any("--draft-max" in line for line in card.splitlines() if line.startswith("llama-"))
    assert "ik_llama.cpp" in card
    assert "hf download me/x drafter-Q8_0.gguf --local-dir ." in card


def test_card_pairs_with_s_target_by_layer_count():
    p = pair_target(info(target_name=None, target_n_layer=48, target_layer_ids=tuple(S_IDS)))
    assert p.certain and p.official is not None and p.official.repo == "poolside/Laguna-S-2.1-GGUF"


def test_card_guesses_from_target_name_and_says_so():
    p = pair_target(info(target_name="Laguna-S-2.1", target_n_layer=None))
    assert not p.certain and p.official is not None and p.official.repo == "poolside/Laguna-S-2.1-GGUF"
    assert any("not the target's layer count" in line for line in p.lines)


def test_card_says_plainly_when_target_is_unknown():
    d = info(target_name=None, target_n_layer=None, source_repo=None, license=None)
    card = build_model_card("me/x", [d])
    assert "does not record which target it was checked against" in card
    assert "at least 40 layers and hidden size 2048" in card
    assert "Laguna-XS-2.1-GGUF" not in card
    meta = front_matter(card)
    assert "base_model" not in meta and "license" not in meta
    assert "TARGET.gguf" in card


def test_card_uses_an_uploaded_target_in_the_commands():
    target = GGUFInfo(
        filename="Laguna-XS-2.1-F32.gguf", size=10, sha256="cd" * 32, architecture="laguna",
        file_type=0, tensor_types=(("F32", 1),), block_count=40, embedding_length=2048,
    )
    card = build_model_card("me/x", [info(), target])
    assert "Laguna target model (`laguna`): 40 layers, hidden size 2048" in card
    assert "laguna-run -m Laguna-XS-2.1-F32.gguf -md drafter-Q8_0.gguf" in card
    assert "also holds a target that fits it: `Laguna-XS-2.1-F32.gguf`" in card
    # A target with another layer count is not offered as the pair.
    other = GGUFInfo(filename="t48.gguf", size=1, sha256="ef" * 32, architecture="laguna", block_count=48, embedding_length=2048)
    assert pair_target(info(), [other]).uploaded_target is None


def test_card_for_non_drafter_files_only():
    t = GGUFInfo(filename="model.gguf", size=5, sha256="00" * 32, architecture="llama", block_count=2)
    card = build_model_card("me/x", [t])
    meta = front_matter(card)
    assert meta["tags"] == ["gguf"]
    assert "GGUF model (`llama`): 2 layers" in card
    assert "laguna-run" not in card


def test_card_quotes_odd_yaml_values_and_escapes_cells():
    card = build_model_card("me/x", [info(license="other: see LICENSE", filename="a|b.gguf")])
    assert front_matter(card)["license"] == "other: see LICENSE"
    assert "`a\\|b.gguf`" in card


def test_card_with_conflicting_licenses_leaves_yaml_license_out():
    card = build_model_card("me/x", [info(), info(filename="other.gguf", license="mit")])
    assert "license" not in front_matter(card)
    assert "different licenses" in card


def test_card_benchmark_table():
    bench = BenchResults(
        rows=(BenchRow("code", 4, 31.25, 1.5, 2.8), BenchRow("prose", 4, 16.0, 0.8, None)),
        machine="16-core CPU",
        command="laguna-run bench --json",
    )
    card = build_model_card("me/x", [info()], bench)
    assert "| content | n_max | tokens/s | speedup | mean accepted per round |" in card
    assert "| code | 4 | 31.2 | 1.50x | 2.80 |" in card
    assert "| prose | 4 | 16.0 | 0.80x | - |" in card
    assert "on 16-core CPU" in card and "laguna-run bench --json" in card


def test_parse_bench_accepts_the_documented_shape():
    b = parse_bench(
        {"rows": [{"content": "code", "n_max": 4, "tokens_per_s": 31.2, "speedup": 1.5, "mean_accepted": 2.8}],
         "machine": "m", "command": "c"},
        "b.json",
    )
    assert b.rows[0] == BenchRow("code", 4, 31.2, 1.5, 2.8) and b.machine == "m"


@pytest.mark.parametrize(
    "data, where",
    [
        ([], "top level"),
        ({"rows": []}, "rows"),
        ({"rows": [5]}, "rows[0]"),
        ({"rows": [{"content": "", "n_max": 4, "tokens_per_s": 1, "speedup": 1}]}, "rows[0].content"),
        ({"rows": [{"content": "c", "n_max": "4", "tokens_per_s": 1, "speedup": 1}]}, "rows[0].n_max"),
        ({"rows": [{"content": "c", "n_max": 4, "tokens_per_s": 1}]}, "rows[0].speedup"),
        ({"rows": [{"content": "c", "n_max": 4, "tokens_per_s": -1, "speedup": 1}]}, "rows[0].tokens_per_s"),
        ({"rows": [{"content": "c", "n_max": 4, "tokens_per_s": 1, "speedup": 1, "mean_accepted": "x"}]}, "rows[0].mean_accepted"),
        ({"rows": [{"content": "c", "n_max": 4, "tokens_per_s": 1, "speedup": 1}], "machine": 3}, "machine"),
    ],
)
def test_parse_bench_rejects_malformed_input_on_one_line(data, where):
    with pytest.raises(UserError) as e:
        parse_bench(data, "b.json")
    msg = str(e.value)
    assert msg.startswith(f"b.json: {where}: expected ") and "\n" not in msg


# --------------------------------------------------------------------------- reading GGUFs


def test_inspect_gguf_reads_what_the_card_needs(drafter):
    i = up.inspect_gguf(drafter)
    assert i.architecture == K.ARCH and i.is_drafter and i.laguna is True
    assert i.file_type == 7 and dict(i.tensor_types) == {"Q8_0": 3, "F32": 2}
    assert i.target_layer_ids == tuple(XS_IDS) and i.block_size == 16 and i.mask_token_id == 12
    assert i.source_repo == "poolside/Laguna-XS-2.1-DFlash" and i.license == "apache-2.0"
    assert i.target_name == "Laguna-XS.2.1" and i.target_n_layer == 40
    assert i.embedding_length == 64 and i.block_count == 2 and i.size == drafter.stat().st_size


def test_inspect_gguf_without_optional_keys(tmp_path):
    p = write_drafter(tmp_path / "d.gguf", source=None, license=None, target_name=None, target_n_layer=None, ftype=0)
    i = up.inspect_gguf(p)
    assert i.source_repo is None and i.license is None and i.target_name is None and i.target_n_layer is None
    assert dict(i.tensor_types) == {"F32": 5}


def test_inspect_gguf_refuses_a_non_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(UserError, match=r"x\.gguf: not a GGUF file"):
        up.inspect_gguf(p)
    p.write_bytes(b"GGUF\x03\x00")  # right magic, truncated header
    with pytest.raises(UserError, match=r"not a readable GGUF file"):
        up.inspect_gguf(p)


# --------------------------------------------------------------------------- the command, against the stand-in


def test_upload_creates_repo_and_commits_files_and_card(hub, cli, drafter, tmp_path, caplog):
    target = write_target(tmp_path / "Laguna-XS-2.1-F32.gguf")
    caplog.set_level(logging.DEBUG)
    r = cli("me/Laguna-XS-2.1-DFlash-GGUF", drafter, target)
    assert r.exit_code == 0, r.output
    assert "uploaded to" in r.stdout
    assert_no_token(r.stdout, r.stderr, caplog.text)

    # Every request carried the token, and only there.
    assert hub.requests and all(q.header("Authorization") == f"Bearer {TOKEN}" for q in hub.requests)
    creates = hub.calls("POST", "/api/repos/create")
    assert len(creates) == 1 and creates[0].json()["name"] == "Laguna-XS-2.1-DFlash-GGUF"
    assert creates[0].json()["organization"] == "me"
    assert "visibility" not in creates[0].json() or creates[0].json()["visibility"] != "private"

    repo = hub.repos["me/Laguna-XS-2.1-DFlash-GGUF"]
    assert len(repo.commits) == 1
    files = repo.branches["main"]
    assert sha(files[drafter.name]) == sha(drafter)
    assert sha(files[target.name]) == sha(target)
    card = files["README.md"].decode()
    assert front_matter(card)["base_model"] == "poolside/Laguna-XS-2.1-DFlash"
    assert sha(drafter) in card and sha(target) in card
    assert f"laguna-run -m {target.name} -md {drafter.name}" in card
    assert repo.commits[0]["header"]["summary"].startswith("Upload ")

    # The card that arrived is the one --dry-run shows.
    plan = up.prepare_upload("me/Laguna-XS-2.1-DFlash-GGUF", [drafter, target])
    assert plan.card == card


def test_dry_run_sends_nothing_and_prints_plan_and_card(hub, cli, drafter, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    r = cli("me/repo", drafter, "--dry-run", "--revision", "q8")
    assert r.exit_code == 0, r.output
    assert hub.requests == []
    out = r.stdout
    assert "plan: me/repo at revision q8" in out
    assert "create the model repository me/repo if it is missing" in out
    assert "create the branch q8 if it is missing" in out
    assert f"upload {drafter.name}" in out and sha(drafter) in out
    assert "--- README.md ---" in out and "base_model: poolside/Laguna-XS-2.1-DFlash" in out
    assert "--revision q8" in out  # the card's download command follows the branch
    assert "token: none found" in out
    assert "dry run: nothing was sent" in out


def test_dry_run_never_reads_the_token(hub, cli, drafter):
    r = cli("me/repo", drafter, "--dry-run")
    assert r.exit_code == 0 and hub.requests == []
    assert "token: HF_TOKEN is set" in r.stdout
    assert_no_token(r.stdout, r.stderr)


def test_missing_token_is_one_line_exit_2_before_any_request(hub, cli, drafter, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    r = cli("me/repo", drafter)
    assert r.exit_code == 2
    assert r.stderr.startswith("error: no Hugging Face token") and r.stderr.count("\n") == 1
    assert hub.requests == []


def test_refused_commit_is_one_line_exit_2(hub, cli, drafter, caplog):
    caplog.set_level(logging.DEBUG)
    hub.refuse["commit"] = 403
    r = cli("me/repo", drafter)
    assert r.exit_code == 2
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("error: the Hub refused committing to me/repo@main (HTTP 403")
    assert "write access to me" in err
    assert hub.repos["me/repo"].commits == []
    assert_no_token(r.stdout, r.stderr, caplog.text)


def test_refused_repo_creation_is_one_line_exit_2(hub, cli, drafter):
    hub.refuse["create"] = 403
    r = cli("someone-else/repo", drafter)
    assert r.exit_code == 2
    assert "error: the Hub refused creating the repository someone-else/repo (HTTP 403" in r.stderr
    assert not hub.calls("POST", "/commit/")
    assert_no_token(r.stdout, r.stderr)


def test_rejected_token_is_one_line_exit_2_and_not_echoed(hub, cli, drafter, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-secret-0a1b2c3d4e"
    monkeypatch.setenv("HF_TOKEN", wrong)
    r = cli("me/repo", drafter)
    assert r.exit_code == 2
    assert "HTTP 401" in r.stderr and "token was not accepted" in r.stderr
    assert wrong not in r.stdout + r.stderr + caplog.text
    assert hub.requests[0].header("Authorization") == f"Bearer {wrong}"


def test_existing_repo_revision_branch_and_private_note(hub, cli, drafter):
    hub.add_repo("me/repo", private=False, files={"README.md": b"old card"})
    r = cli("me/repo", drafter, "--revision", "q8_0", "--private")
    assert r.exit_code == 0, r.output
    assert not hub.calls("POST", "/api/repos/create")
    assert len(hub.calls("POST", "/api/models/me/repo/branch/q8_0")) == 1
    assert hub.calls("POST", "/api/models/me/repo/commit/q8_0")
    repo = hub.repos["me/repo"]
    assert repo.branches["main"]["README.md"] == b"old card"  # main untouched
    assert sha(repo.branches["q8_0"][drafter.name]) == sha(drafter)
    assert "--private does not change an existing repository" in r.stderr
    assert "/tree/q8_0" in r.stdout


def test_private_flag_reaches_repo_creation(hub, cli, drafter):
    r = cli("me/secret", drafter, "--private")
    assert r.exit_code == 0, r.output
    assert hub.calls("POST", "/api/repos/create")[0].json()["visibility"] == "private"
    assert hub.repos["me/secret"].private


def test_bench_json_lands_in_the_uploaded_card(hub, cli, drafter, tmp_path):
    b = tmp_path / "bench.json"
    b.write_text(json.dumps({"rows": [{"content": "code", "n_max": 4, "tokens_per_s": 31.2, "speedup": 1.5, "mean_accepted": 2.8}],
                             "machine": "test box", "command": "laguna-run bench --json"}))
    r = cli("me/repo", drafter, "--bench-json", b)
    assert r.exit_code == 0, r.output
    card = hub.repos["me/repo"].branches["main"]["README.md"].decode()
    assert "| code | 4 | 31.2 | 1.50x | 2.80 |" in card and "test box" in card


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda d, t: ["me/repo", d, "--bench-json", t / "missing.json"], "cannot read the benchmark file"),
        (lambda d, t: ["me/repo", d, "--bench-json", t / "bad.json"], "not valid JSON"),
        (lambda d, t: ["not a repo", d], 'REPO_ID: expected "owner/name"'),
        (lambda d, t: ["me/repo", t / "nope.gguf"], "nope.gguf: no such file"),
        (lambda d, t: ["me/repo", t / "junk.gguf"], "junk.gguf: not a GGUF file"),
        (lambda d, t: ["me/repo", d, d], "same file name"),
        (lambda d, t: ["me/repo", d, "--revision", "a b"], "--revision: expected a branch name"),
    ],
)
def test_user_mistakes_exit_2_on_one_line_without_requests(hub, cli, drafter, tmp_path, make_args, message):
    (tmp_path / "bad.json").write_text("{rows: oops")
    (tmp_path / "junk.gguf").write_bytes(b"\x00" * 64)
    r = cli(*make_args(drafter, tmp_path))
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert message in r.stderr
    assert hub.requests == []


def test_readme_md_cannot_be_uploaded_as_a_file(hub, cli, tmp_path):
    p = write_drafter(tmp_path / "README.md")
    r = cli("me/repo", p)
    assert r.exit_code == 2 and "generated model card" in r.stderr


def test_help_teaches_the_command(cli):
    r = cli("--help")
    assert r.exit_code == 0
    for needle in ("REPO_ID", "--dry-run", "--private", "--revision", "--bench-json", "HF_TOKEN", "laguna-run bench --json"):
        assert needle in r.stdout


# --------------------------------------------------------------------------- function-level API


def test_function_api_dry_run_and_real(hub, drafter):
    dry = up.upload("me/api", [drafter], dry_run=True)
    assert dry.dry_run and dry.commit_url is None and hub.requests == []
    assert dry.plan.files[0].info.sha256 == sha(drafter)
    real = up.upload("me/api", [drafter])
    assert not real.dry_run and real.commit_url and "/me/api/commit/" in real.commit_url
    assert hub.repos["me/api"].branches["main"]["README.md"].decode() == dry.plan.card


def test_scrub_removes_token_and_auth_values():
    text = f"failed: Authorization: Bearer {TOKEN} url?x={TOKEN} also hf_abcdefghijklmnop"
    out = up.scrub(text, TOKEN)
    assert TOKEN not in out and "hf_abcdefghijklmnop" not in out


def test_model_card_module_is_pure():
    # model_card must not need the Hub client or the filesystem: it only imports stdlib and errors.
    src = Path(model_card.__file__).read_text()
    assert "huggingface_hub" not in src and "open(" not in src


def test_end_to_end_in_a_fresh_process(hub, drafter, tmp_path):
    """A separate interpreter, HF_ENDPOINT and HF_HOME set before huggingface_hub is imported."""
    import os
    import subprocess

    script = (
        "import sys, typer\n"
        "from laguna_dflash.convert import upload\n"
        "app = typer.Typer()\n"
        "upload.register(app)\n"
        "app.command('noop')(lambda: None)\n"
        "app(sys.argv[1:])\n"
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", script, "upload", "me/fresh", str(drafter)],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert_no_token(run.stdout, run.stderr)
    assert sha(hub.repos["me/fresh"].branches["main"][drafter.name]) == sha(drafter)
    # Whatever huggingface_hub fetched on its own went to the stand-in too, never elsewhere, and only
    # the repository calls carry the token.
    for q in hub.requests:
        assert q.header("Authorization") in (None, f"Bearer {TOKEN}")
        if q.path.startswith("/api/models/") or q.path.startswith("/api/repos/"):
            assert q.header("Authorization") == f"Bearer {TOKEN}"

    env["HF_TOKEN"] = "wrong-token-5b6c7d8e9f"
    refused = subprocess.run(
        [sys.executable, "-c", script, "upload", "me/fresh", str(drafter)],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith("error: the Hub refused")
    assert "wrong-token-5b6c7d8e9f" not in refused.stdout + refused.stderr


def test_a_non_gguf_is_reported_before_the_token(hub, cli, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    junk = tmp_path / "notes.gguf"
    junk.write_text("hello")
    r = cli("me/repo", junk)
    assert r.exit_code == 2 and "notes.gguf: not a GGUF file" in r.stderr and hub.requests == []


def test_refused_preupload_is_one_line_exit_2(hub, cli, drafter):
    hub.refuse["preupload"] = 403
    r = cli("me/repo", drafter)
    assert r.exit_code == 2
    assert f"error: the Hub refused uploading {drafter.name} (HTTP 403" in r.stderr
    assert not hub.calls("POST", "/commit/")
    assert_no_token(r.stdout, r.stderr)
