"""With SmolLM2 fetched (and its heads shipped), the page opens on SmolLM2 + chat template + EAGLE."""
import re

from fastapi.testclient import TestClient

from app.config import AppConfig
from app.main import create_app


def selected(html: str, select_id: str) -> str:
    body = re.search(rf'<select id="{select_id}"[^>]*>(.*?)</select>', html, re.S).group(1)
    return re.search(r'<option value="([^"]*)"[^>]*? selected', body).group(1)


def test_the_page_opens_on_smollm2_with_eagle_and_offers_heads_where_they_exist(smollm2_dir, models_dir):
    with TestClient(create_app(AppConfig(models_dir=models_dir)), base_url="http://localhost") as client:
        html = client.get("/").text
        assert selected(html, "f-model") == "smollm2-135m" and selected(html, "f-method") == "eagle"
        assert re.search(r'id="f-chat"[^>]*checked', html)
        method = re.search(r'<select id="f-method".*?</select>', html, re.S).group(0)
        assert '<option value="medusa"' in method and 'value="draft_model" disabled' not in method   # its draft
        assert '<option value="draft_model"' in method
        # the race: plain against the EAGLE head, the draft model offered beside it
        assert (selected(html, "race-setting"), selected(html, "race-a"), selected(html, "race-b")) == \
            ("method", "none", "eagle")
        race_b = re.search(r'<select id="race-b".*?</select>', html, re.S).group(0)
        assert 'value="eagle" data-setting="method"' in race_b and 'value="draft_model"' in race_b
        html = client.get("/?model=target-gqa").text            # no heads trained for the GQA variant
        assert 'value="eagle" disabled' in html
    with TestClient(create_app(AppConfig(models_dir=models_dir, demo="character")), base_url="http://localhost") as client:
        assert selected(client.get("/").text, "f-method") == "draft_model"
