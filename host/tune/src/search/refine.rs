//! The verifying phases of the search: frontier points picked and run on the real scaler (the
//! simulator), then refined where the screening and the scaler disagree.

use super::screening::Screened;
use super::{
    Candidate, Goal, Input, Point, SearchError, Trace, VERIFY_BUDGET_JOBS, parallel, verify,
};

/// The screening frontier: (screened instance-hours, screened wait p95, the candidate).
pub(super) type Front = [(f64, f64, Screened)];

/// Verifies frontier points, then refines; every verified point, and the current policy's.
pub(super) fn verify_frontier(
    input: &Input,
    goal: &Goal,
    trace: &Trace<'_>,
    front: &Front,
    current: &Candidate,
) -> Result<(Vec<Point>, Point), SearchError> {
    // Each run costs about the fitted trace's length.
    let budget = (VERIFY_BUDGET_JOBS / trace.fit.len().max(1)).clamp(2, 12);
    let mut to_verify: Vec<Candidate> = picks(front, goal, budget)
        .iter()
        .filter_map(|&i| front.get(i).map(|(_, _, s)| s.candidate.clone()))
        .collect();
    to_verify.push(current.clone());
    let mut points = verify_all(input, goal, trace, to_verify)?;
    let current_point = points
        .pop()
        .ok_or(SearchError::Policy("no current policy".into()))?;
    let mut runs = points.len();
    let batch_size = input.threads.max(1);
    loop {
        let wanted = next_batch(front, &points, goal, batch_size);
        if wanted.is_empty() || runs >= budget + 4 {
            break;
        }
        let batch: Vec<Candidate> = wanted
            .iter()
            .filter_map(|&i| front.get(i).map(|(_, _, s)| s.candidate.clone()))
            .filter(|c| !points.iter().any(|p| p.candidate.label == c.label))
            .collect();
        if batch.is_empty() {
            break;
        }
        runs += batch.len();
        points.extend(verify_all(input, goal, trace, batch)?);
    }
    Ok((points, current_point))
}

/// Which frontier points to verify first: the cheapest that screens as meeting the goal and
/// the one just cheaper, then a spread over the rest, as many as the budget allows.
fn picks(front: &Front, goal: &Goal, budget: usize) -> Vec<usize> {
    let goal_at = front
        .iter()
        .position(|(_, p95, _)| goal.wait_p95_s > 0.0 && *p95 <= goal.wait_p95_s)
        .unwrap_or(front.len().saturating_sub(1));
    let mut picks: Vec<usize> = vec![goal_at];
    if goal_at > 0 {
        picks.push(goal_at - 1);
    }
    let spread = budget.saturating_sub(picks.len());
    for k in 0..spread {
        if front.len() > 1 && spread > 1 {
            picks.push(k * (front.len() - 1) / (spread - 1));
        }
    }
    picks.sort_unstable();
    picks.dedup();
    picks.truncate(budget.max(2));
    picks
}

/// Runs `candidates` on the real scaler over the fitted trace, in parallel, in order.
fn verify_all(
    input: &Input,
    goal: &Goal,
    trace: &Trace<'_>,
    candidates: Vec<Candidate>,
) -> Result<Vec<Point>, SearchError> {
    let verified = parallel(&candidates, input.threads, |c| {
        verify(input, goal, c, &trace.sim_fit, trace.start)
    });
    candidates
        .into_iter()
        .zip(verified)
        .map(|(candidate, fit)| {
            Ok(Point {
                candidate,
                fit: fit?,
            })
        })
        .collect()
}

/// The refinement's next frontier points (ordered by screened cost): climb while no verified
/// point meets the goal (the screening can be optimistic); else first the cheaper points the
/// screening thinks are near the goal (closest to the hit first), then bisection between the
/// cheapest verified point that meets it and the verified point below, until they are
/// neighbours. Every point skipped is dominated by a verified one.
fn next_batch(front: &Front, points: &[Point], goal: &Goal, batch_size: usize) -> Vec<usize> {
    let verified: Vec<(usize, bool)> = points
        .iter()
        .filter_map(|p| {
            front
                .iter()
                .position(|(_, _, s)| s.candidate.label == p.candidate.label)
                .map(|i| (i, p.fit.meets(goal)))
        })
        .collect();
    let Some(hit) = verified.iter().filter(|(_, m)| *m).map(|(i, _)| *i).min() else {
        let top = verified.iter().map(|(i, _)| *i).max().map_or(0, |i| i + 1);
        return (top..front.len()).take(batch_size).collect();
    };
    let near: Vec<usize> = (0..hit)
        .rev()
        .filter(|i| !verified.iter().any(|(v, _)| v == i))
        .filter(|&i| {
            front
                .get(i)
                .is_some_and(|(_, p95, _)| *p95 <= goal.wait_p95_s * 1.1)
        })
        .take(batch_size)
        .collect();
    if !near.is_empty() {
        return near;
    }
    let below = verified
        .iter()
        .filter(|(i, _)| *i < hit)
        .map(|(i, _)| *i + 1)
        .max()
        .unwrap_or(0);
    let gap = hit - below;
    (1..=batch_size.min(gap))
        .map(|k| below + k * gap / (batch_size.min(gap) + 1))
        .filter(|&i| i < hit)
        .collect()
}
