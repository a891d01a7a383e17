//! What the jobs list shows of the jobs a caller may see: a tally of all of
//! them by state, then one page of the ones that match the caller's search
//! and state filter. A host holds hundreds of jobs; the list sends one page
//! each second, not every row.

use serde::Deserialize;

use crate::service::{JobState, JobStatus};

/// Rows on a page of the jobs list.
pub(super) const PER_PAGE: usize = 50;

/// The longest search the list takes; a longer one is cut to it.
const MAX_SEARCH: usize = 200;

/// Which states the list shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum StateFilter {
    /// Every job (also the empty `?state=` of the form).
    #[default]
    #[serde(alias = "")]
    All,
    /// Running.
    Running,
    /// Failed or restarting: the ones that need a look.
    Trouble,
    /// Starting, stopping, upgrading or rescaling.
    Changing,
    /// Stopped.
    Stopped,
}

impl StateFilter {
    /// Every filter, with the words the list's menu shows for it.
    pub(super) const CHOICES: [(StateFilter, &'static str, &'static str); 5] = [
        (StateFilter::All, "", "all"),
        (StateFilter::Running, "running", "running"),
        (StateFilter::Trouble, "trouble", "failed or restarting"),
        (StateFilter::Changing, "changing", "starting, stopping or changing"),
        (StateFilter::Stopped, "stopped", "stopped"),
    ];

    fn admits(self, state: JobState) -> bool {
        match self {
            StateFilter::All => true,
            StateFilter::Running => state == JobState::Running,
            StateFilter::Trouble => matches!(state, JobState::Failed | JobState::Restarting),
            StateFilter::Changing => {
                matches!(state, JobState::Starting | JobState::Stopping | JobState::Upgrading | JobState::Rescaling)
            }
            StateFilter::Stopped => state == JobState::Stopped,
        }
    }
}

/// The list's query string: `?q=` (text in the job's id or tenant, any
/// case), `?state=` and `?page=` (from 0; past the last, the last).
#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    #[serde(default)]
    q: Option<String>,
    #[serde(default)]
    state: StateFilter,
    #[serde(default)]
    page: Option<usize>,
}

/// The jobs by state, over every job the caller may see.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Tally {
    pub(super) total: usize,
    pub(super) running: usize,
    pub(super) trouble: usize,
    pub(super) changing: usize,
    pub(super) stopped: usize,
}

/// One page of the list.
#[derive(Debug)]
pub(super) struct ListPage {
    /// The jobs on this page, with their tenants.
    pub(super) rows: Vec<(String, JobStatus)>,
    /// The page, from 0.
    pub(super) page: usize,
    /// Pages of matching jobs (at least 1).
    pub(super) pages: usize,
    /// Jobs that match the query, on every page.
    pub(super) matching: usize,
    /// Whether a search or a state filter narrowed the list.
    pub(super) filtered: bool,
    /// Every visible job by state.
    pub(super) tally: Tally,
}

impl ListPage {
    /// The number (from 1) of the first row on this page.
    pub(super) fn first(&self) -> usize {
        self.page * PER_PAGE + 1
    }
}

/// The page of `jobs` that `query` asks for.
pub(super) fn page(jobs: Vec<(String, JobStatus)>, query: &ListQuery) -> ListPage {
    let mut tally = Tally { total: jobs.len(), ..Tally::default() };
    for (_, job) in &jobs {
        for (filter, count) in [
            (StateFilter::Running, &mut tally.running),
            (StateFilter::Trouble, &mut tally.trouble),
            (StateFilter::Changing, &mut tally.changing),
            (StateFilter::Stopped, &mut tally.stopped),
        ] {
            *count += usize::from(filter.admits(job.state));
        }
    }
    let search: Option<String> = query
        .q
        .as_deref()
        .map(|q| q.trim().chars().take(MAX_SEARCH).collect::<String>().to_lowercase())
        .filter(|q| !q.is_empty());
    let matches = |tenant: &str, job: &JobStatus| {
        query.state.admits(job.state)
            && search.as_deref().is_none_or(|q| job.id.to_lowercase().contains(q) || tenant.to_lowercase().contains(q))
    };
    let matching: Vec<(String, JobStatus)> = jobs.into_iter().filter(|(tenant, job)| matches(tenant, job)).collect();
    let pages = matching.len().div_ceil(PER_PAGE).max(1);
    let page = query.page.unwrap_or(0).min(pages - 1);
    ListPage {
        matching: matching.len(),
        rows: matching.into_iter().skip(page * PER_PAGE).take(PER_PAGE).collect(),
        page,
        pages,
        filtered: search.is_some() || query.state != StateFilter::All,
        tally,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A status of job `id` in `state` with no figures (also for `pages`'s
    /// tests).
    pub(in crate::dashboard) fn job(id: &str, state: JobState) -> JobStatus {
        let mut status: JobStatus = serde_json::from_value(serde_json::json!({
            "id": id, "module": "m", "state": "running", "desired": "running",
            "reason": null, "records_in": 0, "records_out": 0, "lag_records": 0,
            "last_checkpoint": 0, "last_checkpoint_seconds": 0.0, "last_checkpoint_age_seconds": null,
            "checkpoints": 0, "restarts": 0, "dead_letters": 0, "cpu_seconds": 0.0, "state_bytes": 0,
            "uptime_seconds": null, "restored_records": 0, "restored_bytes": 0, "restore_seconds": 0.0,
            "late_records": 0, "timers_fired": 0, "tasks": [], "shards": []
        }))
        .expect("a status");
        status.state = state;
        status
    }

    /// 120 jobs of tenant `acme`: every 10th failed, every 10th (+1) stopped.
    fn jobs() -> Vec<(String, JobStatus)> {
        (0..120)
            .map(|i| {
                let state = match i % 10 {
                    0 => JobState::Failed,
                    1 => JobState::Stopped,
                    _ => JobState::Running,
                };
                ("acme".to_owned(), job(&format!("job-{i:03}"), state))
            })
            .collect()
    }

    fn parse(text: &str) -> Result<ListQuery, axum::extract::rejection::QueryRejection> {
        let uri: axum::http::Uri = format!("/ui/jobs?{text}").parse().expect("a uri");
        axum::extract::Query::try_from_uri(&uri).map(|q| q.0)
    }

    fn query(text: &str) -> ListQuery {
        parse(text).expect("a query")
    }

    #[test]
    fn the_list_is_paged_and_a_page_past_the_end_is_the_last() {
        let first = page(jobs(), &query(""));
        assert_eq!((first.rows.len(), first.page, first.pages, first.matching), (PER_PAGE, 0, 3, 120));
        assert_eq!(first.rows[0].1.id, "job-000");
        let last = page(jobs(), &query("page=7"));
        assert_eq!((last.rows.len(), last.page, last.first()), (20, 2, 101));
        assert_eq!(last.rows[0].1.id, "job-100");
        assert!(!last.filtered);
    }

    #[test]
    fn the_tally_counts_every_job_whatever_the_filter() {
        let trouble = page(jobs(), &query("state=trouble"));
        let expected = Tally { total: 120, running: 96, trouble: 12, changing: 0, stopped: 12 };
        assert_eq!(trouble.tally, expected);
        assert_eq!((trouble.matching, trouble.pages), (12, 1));
        assert!(trouble.rows.iter().all(|(_, j)| j.state == JobState::Failed));
        assert!(trouble.filtered);
        // The form's empty choice is every state.
        assert_eq!(page(jobs(), &query("state=&q=")).matching, 120);
    }

    #[test]
    fn the_search_matches_id_or_tenant_in_any_case() {
        assert_eq!(page(jobs(), &query("q=JOB-11")).matching, 10);
        assert_eq!(page(jobs(), &query("q=acm")).matching, 120);
        let none = page(jobs(), &query("q=nothing&state=stopped"));
        assert_eq!((none.matching, none.pages, none.rows.len()), (0, 1, 0));
    }

    #[test]
    fn an_unknown_state_is_refused() {
        let refused = parse("state=sleeping").expect_err("no such state");
        assert!(refused.body_text().contains("state"), "the message names the field: {}", refused.body_text());
    }
}
