//! The last phases of the search: the verified frontier and the recommendation on it, what to
//! say when nothing meets the goal, and the replays the recommendation was not fitted to (the
//! held-out days, and half again as many jobs).

use super::refine::Front;
use super::screening::Screened;
use super::{
    Candidate, Estimate, Goal, Input, Point, SearchError, Trace, Verified, day_start, parallel,
    pareto, plus_half, sim_jobs, verify,
};
use flotilla_scaler::sim::Job as SimJob;

/// The verified frontier (without timeouts, by cost), with the recommendation on it.
pub(super) struct Verdict {
    pub(super) frontier: Vec<Point>,
    pub(super) recommended: Option<Point>,
    pub(super) next_cheaper: Option<Point>,
    pub(super) unreachable: Option<String>,
}

impl Verdict {
    /// The cheapest verified point that meets the goal, and the next cheaper one; or why
    /// none does. `current` and `screened` count for the fewest timeouts when every policy
    /// tried has some.
    pub(super) fn of(
        goal: &Goal,
        points: &[Point],
        current: &Point,
        screened: &[Screened],
    ) -> Verdict {
        let frontier: Vec<Point> = pareto(
            points
                .iter()
                .filter(|p| p.fit.timed_out == 0)
                .map(|p| (p.fit.instance_hours, p.fit.wait_p95_s, p.clone()))
                .collect(),
        )
        .into_iter()
        .map(|(_, _, p)| p)
        .collect();
        let recommended = frontier.iter().find(|p| p.fit.meets(goal)).cloned();
        let next_cheaper = recommended.as_ref().and_then(|r| {
            frontier
                .iter()
                .rfind(|p| p.fit.instance_hours < r.fit.instance_hours)
                .cloned()
        });
        let unreachable = match recommended {
            Some(_) => None,
            None => Some(unreachable(goal, &frontier, points, current, screened)),
        };
        Verdict {
            frontier,
            recommended,
            next_cheaper,
            unreachable,
        }
    }
}

/// Why no policy is recommended: the closest goal the frontier reaches, or, when every
/// policy tried times out, the fewest that give up among the verified ones, the current one
/// and the screened ones (when every screened candidate times out, none is verified).
fn unreachable(
    goal: &Goal,
    frontier: &[Point],
    points: &[Point],
    current: &Point,
    screened: &[Screened],
) -> String {
    if let Some(best) = frontier.iter().map(|p| p.fit.wait_p95_s).reduce(f64::min) {
        return format!(
            "no policy tried meets a wait p95 of {}s; the closest achievable goal is --wait-p95 {}s",
            goal.wait_p95_s,
            best.ceil().max(1.0)
        );
    }
    let fewest = points
        .iter()
        .map(|p| p.fit.timed_out)
        .chain(std::iter::once(current.fit.timed_out))
        .chain(screened.iter().map(|s| s.figures.timed_out))
        .min()
        .unwrap_or(0);
    let some = if fewest > 0 {
        format!("at least {fewest} job(s)")
    } else {
        "some jobs".to_string()
    };
    format!(
        "no policy tried avoids timeouts: {some} give up waiting (instance_acquire_timeout) even with the most idle capacity; raise max_instances or instance_acquire_timeout"
    )
}

/// The replays after the fit: the current policy and the recommendation on the held-out days,
/// and the recommendation under half again as many jobs.
pub(super) struct Later {
    pub(super) held_start: Option<i64>,
    pub(super) current_holdout: Option<Verified>,
    pub(super) recommended_holdout: Option<Verified>,
    pub(super) plus_half_load: Option<Verified>,
    pub(super) holdout_miss: Option<String>,
}

/// Runs the replays, in parallel. The +50% load runs on the held-out part when there is one:
/// it is shorter, and the load the recommendation was not fitted to.
pub(super) fn later(
    input: &Input,
    goal: &Goal,
    trace: &Trace<'_>,
    current: &Candidate,
    recommended: Option<&Point>,
) -> Result<Later, SearchError> {
    let held_start = trace.held.first().map(|j| day_start(j.submit_ms));
    let sim_held = held_start.map(|s| (s, sim_jobs(trace.held, s)));
    let mut runs: Vec<(Candidate, Vec<SimJob>, i64)> = Vec::new();
    if let Some((s, jobs)) = &sim_held {
        runs.push((current.clone(), jobs.clone(), *s));
        if let Some(r) = recommended {
            runs.push((r.candidate.clone(), jobs.clone(), *s));
        }
    }
    if let Some(r) = recommended {
        match &sim_held {
            Some((s, jobs)) => runs.push((r.candidate.clone(), plus_half(jobs), *s)),
            None => runs.push((r.candidate.clone(), plus_half(&trace.sim_fit), trace.start)),
        }
    }
    let results = parallel(&runs, input.threads, |(c, jobs, s)| {
        verify(input, goal, c, jobs, *s)
    });
    let mut results = results.into_iter();
    let mut take = || results.next().transpose();
    let current_holdout = if sim_held.is_some() { take()? } else { None };
    let recommended_holdout = if sim_held.is_some() && recommended.is_some() {
        take()?
    } else {
        None
    };
    let plus_half_load = if recommended.is_some() { take()? } else { None };
    Ok(Later {
        held_start,
        current_holdout,
        holdout_miss: recommended_holdout
            .as_ref()
            .and_then(|held| missed(goal, held)),
        recommended_holdout,
        plus_half_load,
    })
}

/// The warning when the recommendation misses the goal on the held-out days.
fn missed(goal: &Goal, held: &Verified) -> Option<String> {
    if held.meets(goal) {
        return None;
    }
    let timeouts = if held.timed_out > 0 {
        format!(", {} job(s) gave up waiting", held.timed_out)
    } else {
        String::new()
    };
    Some(format!(
        "the recommendation misses the goal on the held-out days: wait p95 {:.1}s against {}s{timeouts}. The fitted days did not look like them (a busier week, a new pipeline); hold out less (--holdout), tune on a longer history, or take a policy with more idle capacity from the frontier",
        held.wait_p95_s, goal.wait_p95_s
    ))
}

/// The screening's figures for the frontier points that were not verified.
pub(super) fn estimates(front: &Front, verified: &[Point]) -> Vec<Estimate> {
    front
        .iter()
        .filter(|(_, _, s)| {
            !verified
                .iter()
                .any(|p| p.candidate.label == s.candidate.label)
        })
        .map(|(_, _, s)| Estimate {
            label: s.candidate.label.clone(),
            instance_hours: s.figures.instance_hours,
            wait_p50_s: s.figures.wait_p50_s,
            wait_p95_s: s.figures.wait_p95_s,
            wait_max_s: s.figures.wait_max_s,
        })
        .collect()
}
