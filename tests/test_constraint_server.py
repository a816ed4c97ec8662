"""Structured output through laguna-run serve (speculation on, loopback), driven by clients
nobody here wrote: the official ``openai`` package's ``chat.completions.parse`` with a pydantic
model, instructor, and llama-server's ``grammar`` / ``json_schema`` fields over httpx. The server
answers what the Python API answers under the same constraint; a bad constraint is a 400 naming
the field and the next request is served."""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
pytest.importorskip("fastapi")

from laguna_dflash.runtime.chat_template import ChatTemplate  # noqa: E402
from laguna_dflash.runtime.constraint import Constraint  # noqa: E402
from laguna_dflash.runtime.engine import Engine, EngineConfig, GenerateOptions  # noqa: E402
from server_harness import TEMPLATE, LiveServer, make_pool, openai_client as client  # noqa: E402


class Settings(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=16)
    size: int = pydantic.Field(ge=0, le=999)
    enabled: bool


MESSAGES = [{"role": "user", "content": "import json\n\n# the settings, as JSON\nSETTINGS = "}]


@pytest.fixture(scope="module")
def srv(models):
    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter, parallel=2, max_queue=8), n_max=4) as s:
        yield s


@pytest.fixture(scope="module")
def ref(models):
    target, path, drafter = models
    with Engine(target, path, EngineConfig(n_ctx=2048, kv_type="f32", n_threads=1), drafter_model=drafter) as e:
        yield e



def test_openai_parse_with_a_pydantic_model_equals_the_python_api(srv, ref):
    completion = client(srv).chat.completions.parse(model="laguna-tiny", messages=MESSAGES, response_format=Settings,
                                                    max_tokens=120, temperature=0)
    message = completion.choices[0].message
    assert isinstance(message.parsed, Settings), message.content
    assert completion.choices[0].finish_reason == "stop"
    # the server's answer is the Python API's under the schema the client sent, at depth 4
    schema = openai.lib._pydantic.to_strict_json_schema(Settings)
    prompt = ref.tokenize(ChatTemplate(TEMPLATE, "t").render(MESSAGES, add_generation_prompt=True))
    res = ref.generate(prompt, GenerateOptions(n_predict=120, n_max=4, constraint=Constraint.json_schema(schema)))
    assert message.content == res.text
    assert res.stats.drafted > 0


def test_instructor_structured_output(srv):
    instructor = pytest.importorskip("instructor")
    c = instructor.from_openai(client(srv), mode=instructor.Mode.JSON_SCHEMA)
    settings = c.chat.completions.create(model="laguna-tiny", messages=MESSAGES, response_model=Settings,
                                         max_tokens=120, temperature=0, max_retries=0)
    assert isinstance(settings, Settings)


def test_llama_server_grammar_and_json_schema_fields(srv):
    with httpx.Client(base_url=srv.url, timeout=120) as h:
        r = h.post("/v1/completions", json={"prompt": "def ok():\n    return ", "max_tokens": 16, "temperature": 0,
                                            "grammar": 'root ::= "True" | "False" | "None"'})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] in ("True", "False", "None")
        schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
                  "required": ["n"], "additionalProperties": False}
        r = h.post("/v1/completions", json={"prompt": "x = ", "max_tokens": 40, "temperature": 0, "json_schema": schema})
        assert r.status_code == 200, r.text
        assert 0 <= json.loads(r.json()["choices"][0]["text"])["n"] <= 99
        r = h.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 200, "temperature": 0,
                                                 "response_format": {"type": "json_object"}})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer",
                                                                                         "minimum": "zero"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"grammar": 'root ::= "a" | ('}, "grammar"),
    ({"json_schema": {"type": "string", "format": "no-such"}}, "json_schema"),
    ({"grammar": 'root ::= "a"', "json_schema": {}}, "json_schema"),
])
def test_bad_constraints_are_400s_naming_the_field_and_the_server_goes_on(srv, body, param):
    with httpx.Client(base_url=srv.url, timeout=120) as h:
        r = h.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 8, **body})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["message"].startswith(f"{param}: expected ")
        assert "\n" not in err["message"]
        r = h.post("/v1/completions", json={"prompt": "x = ", "max_tokens": 4})
        assert r.status_code == 200
