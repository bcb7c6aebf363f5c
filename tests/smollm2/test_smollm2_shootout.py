"""The Shoot-out on SmolLM2 without vLLM: its row of our EAGLE head in vLLM says why it has no figures, and the
table of our methods stands (the live row: tests/e2e/vllm_live/test_shootout.py)."""
import re

from fastapi.testclient import TestClient

from app.config import AppConfig
from app.main import create_app


def test_without_vllm_the_shootouts_vllm_row_says_why_and_the_table_stands(smollm2_dir, models_dir):
    form = {"prompt": "What does a bee make?", "model": "smollm2-135m", "chat": "true", "temperature": "0",
            "method": "eagle", "max_tokens": "4", "num_speculative_tokens": "3"}
    with TestClient(create_app(AppConfig(models_dir=models_dir, demo="character", vllm=False)),
                    base_url="http://localhost") as client:
        html = client.post("/teach/shootout", data=form).text
    rows = dict(re.findall(r'<tr data-method="(\w+)">(.*?)</tr>', html, re.S))
    assert list(rows) == ["none", "ngram", "draft_model", "medusa", "eagle", "eagle_tree", "vllm_eagle"], html[:2000]
    assert re.search(r'data-figure="mal">[\d.]+<', rows["eagle"])
    reason = re.search(r'<td colspan="9" data-figure="reason">(.*?)</td>', rows["vllm_eagle"]).group(1)
    assert reason == "vLLM not started: serve --vllm"
