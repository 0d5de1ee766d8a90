"""Writes queries.jsonl: labelled queries for `triage train classifier`.

point  = extractive questions, sampled (seeded) from SQuAD v2 dev and HotpotQA dev (distractor),
         the files `triage models fetch --data` puts in $TRIAGE_HOME/data.
global = global-synthesis questions (summaries, themes, comparisons, overviews across a
         collection), written from templates below over topics taken from SQuAD article titles.

Each row: {"query", "label": "point"|"global", "group", "source"}. `group` names the template
(global) or the source article / question id (point); `triage train classifier` holds out whole
groups, so a template seen in training never appears in the held-out set.
Run: python3 data/query-classes/make.py [DATA_DIR]  (default ~/.cache/triage/data)
"""
import json
import os
import random
import sys

DATA = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/triage/data")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "queries.jsonl")
rng = random.Random(20261130)

GLOBAL_TEMPLATES = [
    "Summarize what the documents say about {t}.",
    "Give me an overview of {t} based on the whole collection.",
    "What are the main themes across these documents about {t}?",
    "Compare how the different documents describe {t}.",
    "What do all of the documents have in common regarding {t}?",
    "Write a short summary of the collection's coverage of {t}.",
    "List the key points made across the corpus about {t}.",
    "How do the sources differ in their treatment of {t}?",
    "What overall picture of {t} emerges from these texts?",
    "Synthesize the documents into a brief report on {t}.",
    "Across all the articles, what recurring ideas appear about {t}?",
    "Contrast the perspectives on {t} found in the collection.",
    "What is the big picture on {t} according to these documents?",
    "Outline the major topics the documents cover about {t}.",
    "Summarise the corpus.",
    "What are the most important themes in this collection?",
    "Give a high-level summary of everything in these documents.",
    "Which topics come up most often across the documents?",
    "How are the documents in this collection related to each other?",
    "Provide an executive summary of the collection.",
    "Describe the evolution of {t} as told across the documents.",
    "What trends in {t} can be seen when reading all the documents together?",
    "Draw conclusions about {t} from the collection as a whole.",
    "Identify the common threads linking the documents on {t}.",
]


def squad_points(n):
    with open(os.path.join(DATA, "squad.json")) as f:
        data = json.load(f)["data"]
    rows, titles = [], []
    for article in data:
        titles.append(article["title"].replace("_", " "))
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                rows.append({"query": qa["question"].strip(), "label": "point",
                             "group": "squad:" + article["title"], "source": "squad-v2-dev"})
    rng.shuffle(rows)
    return rows[:n], titles


def hotpot_points(n):
    with open(os.path.join(DATA, "hotpotqa.json")) as f:
        data = json.load(f)
    rng.shuffle(data)
    return [{"query": r["question"].strip(), "label": "point", "group": "hotpot:" + r["_id"],
             "source": "hotpotqa-dev"} for r in data[:n]]


def globals_(titles, n):
    rows = []
    for i in range(n):
        idx = i % len(GLOBAL_TEMPLATES)
        template = GLOBAL_TEMPLATES[idx]
        topic = rng.choice(titles)
        rows.append({"query": template.format(t=topic), "label": "global",
                     "group": "template:%02d" % idx, "source": "template"})
    return rows


def main():
    squad, titles = squad_points(250)
    hotpot = hotpot_points(250)
    glob = globals_(titles, 480)
    rows = squad + hotpot + glob
    rng.shuffle(rows)
    seen, unique = set(), []
    for r in rows:
        if r["query"] not in seen:
            seen.add(r["query"])
            unique.append(r)
    with open(OUT, "w") as f:
        for r in unique:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print("wrote", len(unique), "rows to", OUT)


main()
