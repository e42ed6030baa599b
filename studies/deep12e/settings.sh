# The strong-baseline study's data and the settings every `ddl compare` of it shares (sourced by run.sh after
# ../commands.sh, which sets $ddl). The corpus is prepared on first use (a cached step; docs/data.md), with its
# source runs (the loss per package).
data=$("$ddl" data prepare --source prose-v1 --val-fraction 0.02 --test-fraction 0.02 --num-proc 1 --no-progress \
  --out "$HOME/.cache/deep_delta/data/prose-v1-byte" >&2 && echo "$HOME/.cache/deep_delta/data/prose-v1-byte")
[ -n "$data" ] || { echo "deep12e: the prose corpus could not be prepared (the lines above say why)" >&2; exit 2; }
# the deep12 recipe: 12 layers, width 64, 2 heads, 300 steps x 16 x 256, embed_norm on, compiled blocks; spread
# validation and test windows (the default); lr chosen on val at seeds 0-1, reported on 250K test tokens at 100-103
common=(--config deep12 --data "$data" --seeds 2 --eval-seeds 4 --eval-seed-start 100 --test-tokens 250K
  --threads 1 --no-progress)
# each design's own grid (factors of 2), placed around its optimum of the deep study (docs/evidence.md) and moved
# where the embedding norm moves it; a best at a grid's edge extends that grid (README.md here says when)
grid_baseline=baseline=4e-3,8e-3,1.6e-2,3.2e-2
grid_cc=ddl-cc=8e-3,1.6e-2,3.2e-2,6.4e-2
grid_twin=ddl-cc-write=6.4e-2,1.28e-1,2.56e-1,5.12e-1
grid_peri=peri-ln=3.2e-2,6.4e-2,1.28e-1,2.56e-1
grid_attnres=attnres-block=4e-3,8e-3,1.6e-2,3.2e-2
# Muon (item 4): the same three designs, each with its own grid over Muon's lr (match_rms_adamw: AdamW's scale)
mgrid_baseline=baseline=4e-3,8e-3,1.6e-2,3.2e-2
mgrid_cc=ddl-cc=8e-3,1.6e-2,3.2e-2,6.4e-2
mgrid_twin=ddl-cc-write=3.2e-2,6.4e-2,1.28e-1,2.56e-1
