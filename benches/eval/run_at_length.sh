#!/usr/bin/env bash
# Issue 22's runs at length, resumable (rerun it after an interruption: every finished answer is
# kept). Per suite: forced RAG and forced long context on 100 dev questions with every signal
# recorded (grounding, 5 samples, the residual stream of 4 layers of the 0.5B); the cheapest τ
# that keeps ≥ 95 % of long context's accuracy on them (the frozen operating point); then rag, lc
# and auto (the calibrated routing) on 300 test questions, each with its report.md. Hours per
# suite on 2 CPU cores: run it in the background. Usage: benches/eval/run_at_length.sh [SUITE ...]
#   TRIAGE_BIN (default target/release/triage), OUT (default ~/.cache/triage/eval16k),
#   TOKENS (default 16384), DEV / TEST (question counts, default 100 / 300),
#   SEARCH (default dense; hybrid: dense + BM25 on every RAG answer, calibrated and tested as
#   such, in runs named SUITE-TOKENS-hybrid-...), STAGES (default "dev test"; "fit" first asks
#   forced RAG the TRAIN dev questions the combined score is fitted on, the signals stage's dev
#   half; "dev" calibrates every suite first and leaves the test splits for a later run;
#   "signals" is the combined
#   score's own study: forced RAG alone, which never prefills a corpus on the long-context model,
#   on TRAIN dev questions (default 600) and on the TEST questions, then `triage signals` fitted
#   on the first and scored on the second, into SUITE-TAG-signals.md),
#   ESCALATION (default tau; combined: the combined score decides instead, fitted on the
#   signals stage's dev RAG answers with the calibration questions left out, its threshold
#   frozen on the dev rag and lc answers, in files and runs named SUITE-TAG-combined-...),
#   SELF_ROUTE (default on; off: the RAG prompt, forced or routed, offers no "unanswerable",
#   in runs named SUITE-TOKENS-SEARCH-nodecline-...; for suites where the offer costs the
#   base model's RAG answers more than it routes, as kv-retrieval's dev answers show),
#   SELF_CHECK (default off; on: every RAG answer is also self-checked, a signal of the
#   combined score, in runs and files named SUITE-TAG-selfcheck-...).
set -euo pipefail
BIN=${TRIAGE_BIN:-target/release/triage}
OUT=${OUT:-$HOME/.cache/triage/eval16k}
TOKENS=${TOKENS:-16384}
DEV=${DEV:-100}
TEST=${TEST:-300}
TRAIN=${TRAIN:-600}
SEARCH=${SEARCH:-dense}
STAGES=${STAGES:-dev test}
ESCALATION=${ESCALATION:-tau}
SELF_ROUTE=${SELF_ROUTE:-on}
SELF_CHECK=${SELF_CHECK:-off}
SUITES=${*:-kv-retrieval squad-v2 hotpotqa}
SIGNALS='samples = 5
probe_layers = [6, 12, 18, 23]'
mkdir -p "$OUT"
if [ "$SELF_ROUTE" = off ]; then
    TAG=$TOKENS-$SEARCH-nodecline
    SETTINGS=$OUT/signals-$SEARCH-nodecline.toml
    # The calibrated file carries self_route itself, so it is not among the SIGNALS the test
    # settings add back.
    printf '[routing.monitor]\n%s\nself_route = false\n\n[routing.retrieval]\nsearch = "%s"\n' \
        "$SIGNALS" "$SEARCH" > "$SETTINGS"
elif [ "$SEARCH" = dense ]; then
    # Runs from before SEARCH existed keep their names and settings files.
    TAG=$TOKENS
    printf '[routing.monitor]\n%s\n' "$SIGNALS" > "$OUT/signals.toml"
    SETTINGS=$OUT/signals.toml
else
    TAG=$TOKENS-$SEARCH
    SETTINGS=$OUT/signals-$SEARCH.toml
    printf '[routing.monitor]\n%s\n\n[routing.retrieval]\nsearch = "%s"\n' "$SIGNALS" "$SEARCH" \
        > "$SETTINGS"
fi
if [ "$SELF_CHECK" = on ]; then
    TAG=$TAG-selfcheck
    WITHOUT=$SETTINGS
    SETTINGS=${SETTINGS%.toml}-selfcheck.toml
    sed 's/^\[routing\.monitor\]$/[routing.monitor]\nself_check = true/' "$WITHOUT" \
        > "$SETTINGS"
    # The test runs' settings get it back with the other signals.
    SIGNALS="$SIGNALS
self_check = true"
fi
# The forced-RAG dev answers a combined score is fitted on (the signals stage's first half).
fit_answers() {
    echo "== $1: forced RAG on $TRAIN dev questions, $(date -u +%FT%TZ)"
    "$BIN" eval --suite "$1" --context-tokens "$TOKENS" --limit "$TRAIN" --split dev --quiet \
        --systems rag --config "$SETTINGS" --out "$OUT/$1-$TAG-dev-rag"
}
for suite in $SUITES; do
    case " $STAGES " in *" fit "*) fit_answers "$suite" ;; esac
done
# The dev rag and lc answers are the same whatever decides; the frozen point is not.
POINT=$TAG
[ "$ESCALATION" = combined ] && POINT=$TAG-combined
for suite in $SUITES; do
    case " $STAGES " in *" dev "*) ;; *) continue ;; esac
    echo "== $suite: dev ($DEV questions at $TOKENS tokens, $SEARCH search), $(date -u +%FT%TZ)"
    fit=()
    [ "$ESCALATION" = combined ] && fit=(--combined-fit "$OUT/$suite-$TAG-dev-rag")
    "$BIN" calibrate --suite "$suite" --context-tokens "$TOKENS" --limit "$DEV" --quiet \
        --config "$SETTINGS" --runs "$OUT/$suite-$TAG-dev" --min-retained 0.95 --cheapest \
        "${fit[@]}" --out "$OUT/$suite-$POINT-calibrated.toml"
    # The test run records the same signals under the calibrated τ or score (and the retrieval
    # settings the calibrated file carries).
    awk -v signals="$SIGNALS" '{ print } /^\[routing\.monitor\]$/ { print signals }' \
        "$OUT/$suite-$POINT-calibrated.toml" > "$OUT/$suite-$POINT-routing.toml"
done
for suite in $SUITES; do
    case " $STAGES " in *" test "*) ;; *) continue ;; esac
    echo "== $suite: test ($TEST questions), $(date -u +%FT%TZ)"
    "$BIN" eval --suite "$suite" --context-tokens "$TOKENS" --limit "$TEST" --split test --quiet \
        --systems rag,lc,auto --config "$OUT/$suite-$POINT-routing.toml" \
        --out "$OUT/$suite-$POINT-test"
    echo "== $suite: done, $(date -u +%FT%TZ)"
done
for suite in $SUITES; do
    case " $STAGES " in *" signals "*) ;; *) continue ;; esac
    fit_answers "$suite"
    echo "== $suite: forced RAG on $TEST test questions, $(date -u +%FT%TZ)"
    "$BIN" eval --suite "$suite" --context-tokens "$TOKENS" --limit "$TEST" --split test \
        --quiet --systems rag --config "$SETTINGS" --out "$OUT/$suite-$TAG-test-rag"
    "$BIN" signals --train "$OUT/$suite-$TAG-dev-rag" --test "$OUT/$suite-$TAG-test-rag" \
        > "$OUT/$suite-$TAG-signals.md"
    echo "== $suite: signals done, $(date -u +%FT%TZ)"
done
