"""The lines `fedjax-dp audit` prints from an audit's report (experiment/audit_run.py):
the one-shot estimate with its verdict, the one-run lower bounds and attack rates,
and the multi-run audit's bound."""

from __future__ import annotations


def format_report(report: dict) -> str:
  lo, hi = report["ci95"]
  acc = report["accounted_epsilon"]

  def verdict(r):
    if r["exceeds_accounted"]:
      return "ABOVE the accounted epsilon: the accountant charged less than was released"
    if acc is None:
      return "no accounted epsilon to compare with"
    if r["ci95"][1] >= acc:   # the first-hour review: 'not above' for 9.8-12.6 around 11.5
      return "consistent with the accounted epsilon: its 95 % interval contains it"
    return ("below the accounted epsilon: this audit finds less than the accountant charges "
            "(an audit bounds the leakage from below)")
  lines = [
      *([f"TEST MODE: {report['undercharged_test_mode']}"]
        if "undercharged_test_mode" in report else []),
      f"privacy audit: {report['canaries']} canaries inserted, {report['held_out']} held out",
      f"  cosines: inserted {report['mu_inserted']:.4g} +- {report['sd_inserted']:.3g}, "
      f"held out {report['mu_held_out']:.4g} +- {report['sd_held_out']:.3g}",
      f"  empirical epsilon {report['empirical_epsilon']:.3f} (95 % interval {lo:.3f} to "
      f"{hi:.3f}, delta {report['delta']:g})",
      f"  accounted epsilon {acc:.3f} ({report['accountant']})" if acc is not None else
      "  accounted epsilon: none reported",
      f"  {verdict(report)}",
      *_one_run_lines(report["one_run"], acc)]
  if "all_iterates" in report:
    it = report["all_iterates"]
    lines += [f"  every round's model seen (largest cosine with a round's change): empirical "
              f"epsilon {it['empirical_epsilon']:.3f} (95 % interval {it['ci95'][0]:.3f} to "
              f"{it['ci95'][1]:.3f}), {verdict(it)}",
              *("  " + line for line in _one_run_lines(it["one_run"], acc))]
  return "\n".join(lines)


def _one_run_lines(bounds: dict, acc: float | None) -> list[str]:
  """The one-run lower bound's lines (adversary/audit.one_run_bounds): the bound, the
  verdict from it alone, what these canaries could show at most, the f-DP figure as
  what it is here, the attack's rates."""
  tpr = ", ".join(f"TPR {v:.3g} at FPR {f}" for f, v in bounds["tpr_at_fpr"].items()
                  if v is not None)
  attack = f"  attack: AUROC {bounds['auroc']:.3f}" + (f", {tpr} (ROC hull, optimistic)"
                                                        if tpr else "")
  if bounds["epsilon_one_run"] is None:
    return [f"  one-run lower bound: none ({bounds['why_none']})", attack]
  fdp = (f"f-DP refinement {bounds['epsilon_one_run_fdp']:.3f}, a bound here (one Gaussian "
         "mechanism)" if bounds["fdp_is_a_bound_here"] else
         f"f-DP figure {bounds['epsilon_one_run_fdp']:.3f} is the Gaussian-DP equivalent, not "
         "a bound for this subsampled release")
  lines = [f"  one-run lower bound: epsilon >= {bounds['epsilon_one_run']:.3f} with confidence "
           f"{bounds['confidence']:g} (Steinke et al. 2023; {fdp})"]
  if acc is not None:
    lines.append("  " + ("ABOVE the accounted epsilon: the accountant charged less than was "
                         "released" if bounds["exceeds_accounted"] else
                         "the lower bound is not above the accounted epsilon"))
    if bounds["largest_possible_bound"] <= acc:
      lines.append(f"  too few canaries to tell: with every guess right the bound would be "
                   f"{bounds['largest_possible_bound']:.3f}, not above the accounted epsilon "
                   "(it falls as canaries x delta grows)")
  return lines + [attack]


def format_runs_report(report: dict) -> str:
  """The multi-run audit's lines."""
  fit, acc = report["gaussian_fit"], report["accounted_epsilon"]
  return "\n".join([
      *([f"TEST MODE: {report['undercharged_test_mode']}"]
        if "undercharged_test_mode" in report else []),
      f"privacy audit: {report['runs']} runs, the canary in {report['inserted_runs']} "
      f"({report['neighbours']} in the others)",
      f"  statistic: with the canary {fit['mu_inserted']:.4g} +- {fit['sd_inserted']:.3g}, "
      f"without {fit['mu_held_out']:.4g} +- {fit['sd_held_out']:.3g}",
      f"  epsilon lower bound {report['epsilon_lower_bound']:.3f} with confidence "
      f"{report['confidence']:g} (threshold test on {sum(report['runs_tested'])} held-out "
      f"runs: {report['false_positives']} false positives, {report['false_negatives']} "
      f"false negatives)",
      f"  Gaussian fit: empirical epsilon {fit['empirical_epsilon']:.3f} (95 % interval "
      f"{fit['ci95'][0]:.3f} to {fit['ci95'][1]:.3f}, delta {fit['delta']:g})",
      f"  accounted epsilon {acc:.3f} ({report['accountant']})" if acc is not None else
      "  accounted epsilon: none reported",
      "  " + ("ABOVE the accounted epsilon: the accountant charged less than was released"
              if report["exceeds_accounted"] else "the lower bound is not above the accounted "
              "epsilon"),
      *([] if report["can_exceed_accounted"] else [
          f"  too few runs to tell: with no error at all the bound would be "
          f"{report['largest_possible_bound']:.3f}, not above the accounted epsilon"])])
