//! The web dashboard of `sluice serve`, at `/`: server-rendered HTML
//! (maud) that htmx refreshes in place, uPlot for the throughput chart, all
//! assets compiled into the binary, so the host needs no other process and
//! no Node toolchain.
//!
//! Two kinds of routes:
//! - **pages** (`/`, `/jobs/{tenant}/{id}`, `/tenant`, `/admin`) and
//!   **assets** (`/assets/...`): public, and holding no data at all: a page
//!   is a skeleton whose regions load their content from fragments;
//! - **fragments** (`/ui/...`): HTML (JSON for the chart and the log) for
//!   one region, behind the same bearer-token check as the API
//!   ([`crate::api`]'s `authenticate`), answered from the same
//!   [`Service`] calls with the same rules: a tenant asking for another
//!   tenant's job gets the same 404 as for a job that does not exist, and
//!   the admin sees every tenant but controls none of their jobs.
//!
//! Sign-in keeps the token in the tab's `sessionStorage` (gone when the tab
//! closes) and `sluice.js` sends it as an `Authorization` header on every
//! fragment request. No cookie carries it, so a page of another site cannot
//! make the browser send an authenticated request: there is nothing for a
//! cross-site request forgery to ride on. Every response forbids framing
//! and inline scripts (a Content-Security-Policy of `'self'` only).
//!
//! Key items: [`router`]; the markup is in `pages`.

mod list;
mod pages;

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Form, Json, Router};
use serde::Deserialize;

use crate::api::{ApiResult, call};
use crate::service::{Caller, Service, ServiceError};

/// The dashboard's public routes (pages and assets) and its fragments, the
/// latter for the caller to put behind authentication.
pub fn routes() -> (Router<Arc<Service>>, Router<Arc<Service>>) {
    let public = Router::new()
        .route("/", get(|| page(pages::View::Jobs)))
        .route("/tenant", get(|| page(pages::View::Tenant)))
        .route("/admin", get(|| page(pages::View::Admin)))
        .route(
            "/jobs/{tenant}/{id}",
            get(|Path((tenant, id)): Path<(String, String)>| page(pages::View::Job { tenant, id })),
        )
        .route("/assets/{name}", get(asset));
    let fragments = Router::new()
        .route("/ui/session", get(session))
        .route("/ui/jobs", get(jobs))
        .route("/ui/jobs/{tenant}/{id}/summary", get(job_summary))
        .route("/ui/jobs/{tenant}/{id}/history", get(job_history))
        .route("/ui/jobs/{tenant}/{id}/throughput", get(job_throughput))
        .route("/ui/jobs/{tenant}/{id}/logs", get(job_logs))
        .route("/ui/jobs/{tenant}/{id}/controls", get(job_controls))
        .route("/ui/jobs/{tenant}/{id}/{action}", post(job_action))
        .route("/ui/operations/{id}", get(operation))
        .route("/ui/tenant", get(tenant))
        .route("/ui/admin", get(admin));
    (public, fragments)
}

/// Headers every dashboard response carries.
fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

async fn page(view: pages::View) -> Response {
    secure(Html(pages::shell(&view).into_string()).into_response())
}

/// The embedded assets: name, content type, bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("htmx.min.js", "text/javascript; charset=utf-8", include_bytes!("assets/htmx.min.js")),
    ("uPlot.iife.min.js", "text/javascript; charset=utf-8", include_bytes!("assets/uPlot.iife.min.js")),
    ("uPlot.min.css", "text/css; charset=utf-8", include_bytes!("assets/uPlot.min.css")),
    ("sluice.js", "text/javascript; charset=utf-8", include_bytes!("assets/sluice.js")),
    ("sluice.css", "text/css; charset=utf-8", include_bytes!("assets/sluice.css")),
];

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, bytes)) => secure(
            ([(header::CONTENT_TYPE, *content_type), (header::CACHE_CONTROL, "public, max-age=300")], *bytes)
                .into_response(),
        ),
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

/// An HTML fragment, with the dashboard's headers.
fn fragment(markup: maud::Markup) -> Response {
    secure(Html(markup.into_string()).into_response())
}

async fn session(State(service): State<Arc<Service>>, Extension(caller): Extension<Caller>) -> ApiResult<Response> {
    let session = call(service, caller, |s, c| Ok(s.session(c))).await?;
    Ok(secure(Json(session).into_response()))
}

async fn jobs(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<list::ListQuery>,
) -> ApiResult<Response> {
    let admin = caller == Caller::Admin;
    let (page, rates) = call(service, caller, move |s, c| {
        let page = list::page(s.visible_jobs(c)?, &query);
        // Rates only for the rows shown.
        let rates = s.visible_rates(&page.rows, pages::SPARK_SECONDS);
        Ok((page, rates))
    })
    .await?;
    Ok(fragment(pages::jobs(&page, &rates, admin)))
}

async fn job_summary(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    Path((tenant, id)): Path<(String, String)>,
) -> ApiResult<Response> {
    let summary = call(service, caller, move |s, c| {
        let status = s.visible_job(c, &tenant, &id)?;
        let (module, world) = s.job_module(c, &tenant, &id)?;
        let rates = s.job_rates(c, &tenant, &id, 1)?;
        Ok(pages::Summary { status, module, world: world.map(str::to_owned), rates })
    })
    .await?;
    Ok(fragment(pages::summary(&summary)))
}

async fn job_history(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    Path((tenant, id)): Path<(String, String)>,
) -> ApiResult<Response> {
    let history = call(service, caller, move |s, c| s.job_history(c, &tenant, &id)).await?;
    Ok(fragment(pages::history(&history)))
}

/// `?seconds=` of a throughput read.
#[derive(Debug, Deserialize)]
struct Seconds {
    seconds: Option<usize>,
}

async fn job_throughput(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    Path((tenant, id)): Path<(String, String)>,
    Query(query): Query<Seconds>,
) -> ApiResult<Response> {
    let seconds = query.seconds.unwrap_or(crate::service::THROUGHPUT_SECONDS);
    let rates = call(service, caller, move |s, c| s.job_rates(c, &tenant, &id, seconds)).await?;
    Ok(secure(Json(rates).into_response()))
}

/// `?after=` of a log read.
#[derive(Debug, Deserialize)]
struct After {
    after: Option<u64>,
}

async fn job_logs(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    Path((tenant, id)): Path<(String, String)>,
    Query(query): Query<After>,
) -> ApiResult<Response> {
    let after = query.after.unwrap_or(0);
    let lines = call(service, caller, move |s, c| s.visible_job_logs(c, &tenant, &id, after, 1000)).await?;
    Ok(secure(Json(lines).into_response()))
}

async fn job_controls(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    Path((tenant, id)): Path<(String, String)>,
) -> ApiResult<Response> {
    let controls = call(service, caller, move |s, c| {
        let status = s.visible_job(c, &tenant, &id)?;
        // Only the owner controls a job; the admin watches.
        let modules = match c {
            Caller::Tenant(_) => Some(s.modules(c)?),
            Caller::Admin => None,
        };
        Ok((tenant, status, modules))
    })
    .await?;
    Ok(fragment(pages::controls(&controls.0, &controls.1, controls.2.as_deref())))
}

/// The form of a control: scale's parallelism, upgrade's module.
#[derive(Debug, Deserialize, Default)]
struct ActionForm {
    parallelism: Option<u32>,
    module: Option<String>,
}

async fn job_action(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    Path((tenant, id, action)): Path<(String, String, String)>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> ApiResult<Response> {
    let form = match form {
        Ok(Form(form)) => form,
        // stop and resume post nothing
        Err(FormRejection::InvalidFormContentType(_)) => ActionForm::default(),
        Err(rejection) => return Ok(fragment(pages::outcome(Err(rejection.body_text())))),
    };
    let outcome = call(service, caller, move |s, c| {
        // The same checks as the API: the caller's own job, by tenant.
        s.visible_record(c, &tenant, &id)?;
        c.tenant()?;
        let missing = |field: &str| ServiceError::BadRequest(format!("`{field}` is missing"));
        match action.as_str() {
            "stop" => s.stop_job(c, &id).map(pages::Outcome::Operation),
            "resume" => s.resume_job(c, &id).map(|status| pages::Outcome::Resumed(Box::new(status))),
            "scale" => {
                let parallelism = form.parallelism.ok_or_else(|| missing("parallelism"))?;
                s.scale_job(c, &id, parallelism).map(pages::Outcome::Operation)
            }
            "upgrade" => {
                let module = form.module.filter(|m| !m.is_empty()).ok_or_else(|| missing("module"))?;
                s.upgrade_job(c, &id, &module).map(pages::Outcome::Operation)
            }
            other => Err(ServiceError::NotFound(format!("no control `{other}`"))),
        }
    })
    .await;
    Ok(fragment(pages::outcome(outcome.map_err(|e| e.message()))))
}

async fn operation(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let operation = call(service, caller, move |s, c| s.operation(c, &id)).await;
    Ok(fragment(pages::outcome(operation.map(pages::Outcome::Operation).map_err(|e| e.message()))))
}

async fn tenant(State(service): State<Arc<Service>>, Extension(caller): Extension<Caller>) -> ApiResult<Response> {
    let usage = call(service, caller, |s, c| {
        let tenant = c.tenant()?.to_owned();
        let usage = s.tenant_usage(c, &tenant)?;
        let modules = s.modules(c)?;
        Ok((usage, modules))
    })
    .await?;
    Ok(fragment(pages::tenant(&usage.0, &usage.1)))
}

async fn admin(State(service): State<Arc<Service>>, Extension(caller): Extension<Caller>) -> ApiResult<Response> {
    let (host, tenants) = call(service, caller, |s, c| Ok((s.host_figures(c)?, s.all_tenant_usage(c)?))).await?;
    Ok(fragment(pages::admin(&host, &tenants)))
}
