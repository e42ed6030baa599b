# The deep study's data and the settings every `ddl compare` of it shares (sourced by run.sh and finish.sh after
# ../commands.sh, which sets $ddl). The corpus is prepared on first use (a cached step; docs/data.md). --eval-windows
# first: the records were made before the setting existed, validating (and measuring test) on the splits' first
# windows; a study of its own on spread windows is another OUT without it (docs/training.md, "Validation windows").
data=$("$ddl" data prepare --source prose-v1 --val-fraction 0.02 --test-fraction 0.02 --num-proc 1 \
  --out "$HOME/.cache/deep_delta/data/prose-v1-byte" >/dev/null && echo "$HOME/.cache/deep_delta/data/prose-v1-byte")
common=(--data "$data" --preset tiny --set model.hidden_size=64 --set model.num_hidden_layers=12
  --set model.num_attention_heads=2 --set model.max_position_embeddings=256 --set model.vocab_size=257
  --steps 300 --batch-size 16 --seq-len 256 --warmup-steps 30 --eval-every 50 --eval-batches 16
  --save-every 50 --keep 1 --lrs 1e-3 2e-3 4e-3 8e-3 1.6e-2 3.2e-2 6.4e-2 1.28e-1 2.56e-1 5.12e-1 --seeds 2 --eval-seeds 4 --eval-seed-start 100
  --test-tokens 250K --eval-windows first --compile --threads 1 --no-progress)
variants=(baseline ddl-cc ddl-cc-write peri-ln attnres-block ddl-cc-untied)
