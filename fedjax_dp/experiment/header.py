"""The line a run starts with (the first-hour review, finding 10: a run said nothing
for up to 45 s, then a 0 % bar): what runs, on what data, on what devices, under which
mechanism and budget, said before the set-up's noise line and the compilation."""

from __future__ import annotations

from fedjax_dp.privacy.mechanisms import get_mechanism


def _privacy_part(cfg) -> str:
  if not get_mechanism(cfg.dp).private:
    from fedjax_dp.recipes.flat import kept_noise_of
    kept = kept_noise_of(cfg)
    return (f"no user-level DP; kept noise '{kept.name}' on the uploads' kept coordinates"
            if kept else "no DP")
  budget = f", budget epsilon {cfg.target_epsilon:g}" if cfg.target_epsilon is not None else ""
  return f"{cfg.dp} DP, clip {cfg.clip_norm:g}{budget} at delta {cfg.delta:g}"


def line(cfg, model_name: str, params: int, devices: int, platform: str, start: int,
         data_name: str | None = None) -> str:
  """'fedavg on digits: 20 clients, 10 a round (fixed), mlp (53,018 parameters), 60
  rounds on 2 cpu devices; no DP' (resumed runs: 'rounds 20 to 60'). `data_name`:
  the data's own name where the config's dataset is 'custom' (data given to run)."""
  rounds = f"rounds {start} to {cfg.rounds}" if start else f"{cfg.rounds} rounds"
  shown = (f"{data_name} (your data)" if cfg.dataset == "custom" and data_name
           and data_name != "custom" else cfg.dataset)
  return (f"{cfg.algorithm} on {shown}: {cfg.num_clients:,} clients, "
          f"{cfg.clients_per_round:,} a round ({cfg.sampling}), {model_name} "
          f"({params:,} parameters), {rounds} on {devices} {platform} "
          f"device{'s' if devices != 1 else ''}; {_privacy_part(cfg)}")
