//! The HTTP control plane of `sluice serve` (axum): a thin layer over
//! [`Service`] that authenticates the bearer token, runs the call on a
//! blocking thread (the service does disk and Kafka I/O and compiles
//! modules), and maps [`ServiceError`] to a status code with a JSON body
//! `{"error": "..."}`.
//!
//! Routes, in the manner of Flink's REST API (the OpenAPI document at
//! `/openapi.json` describes each):
//!
//! | method and path | who | what |
//! |---|---|---|
//! | `GET /healthz` | anyone | liveness |
//! | `GET /openapi.json` | anyone | this API |
//! | `GET /metrics` | admin | Prometheus metrics |
//! | `POST /v1/tenants`, `GET /v1/tenants` | admin | create (returns the token once), list |
//! | `PUT /v1/tenants/{name}/policy` | admin | replace a policy |
//! | `POST /v1/tenants/{name}/token` | admin | rotate a token |
//! | `GET /v1/whoami` | tenant | the caller's tenant and policy |
//! | `POST /v1/modules?name=N`, `GET /v1/modules` | tenant | upload (raw bytes), list |
//! | `GET`, `DELETE /v1/modules/{module}` | tenant | by digest or name |
//! | `POST /v1/jobs`, `GET /v1/jobs` | tenant | create from a JSON spec, list |
//! | `GET`, `DELETE /v1/jobs/{id}` | tenant | status, delete (stopped jobs) |
//! | `GET /v1/jobs/{id}/checkpoints` | tenant | per-task checkpoint figures |
//! | `GET /v1/jobs/{id}/logs?after=SEQ&limit=N` | tenant | log lines |
//! | `POST /v1/jobs/{id}/stop`, `.../upgrade`, `.../scale` | tenant | 202 + an operation to poll |
//! | `POST /v1/jobs/{id}/resume` | tenant | start again from the last checkpoint |
//! | `POST /v1/jobs/{id}/reset` | tenant | move a stopped job's positions, keeping or clearing state |
//! | `GET /v1/operations/{id}` | tenant | a stop's, upgrade's or scale's progress |
//! | `GET /`, `/jobs/...`, `/tenant`, `/admin`, `/assets/...` | anyone | the web dashboard's pages (no data) |
//! | `/ui/...` | tenant, admin | the dashboard's fragments ([`crate::dashboard`]) |
//!
//! A tenant never sees another tenant's modules, jobs or operations: they
//! are looked up under the caller's tenant, so they are 404, the same as
//! names that do not exist.

mod admission;
mod openapi;
pub mod server;
pub mod tls;

use std::sync::Arc;

use axum::Extension;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tower_http::timeout::TimeoutLayer;

use admission::{Admission, Share};

use crate::service::{
    Caller, JobStatus, LogLine, ModuleRecord, Operation, Policy, ResetState, Service, ServiceError, TenantRecord,
    Upload,
};

/// The router of the API over `service`.
///
/// Every route but `/healthz` and `/openapi.json` authenticates first, in
/// [`authenticate`], before its body, path or query is looked at: a caller
/// without a valid token gets 401 and nothing else, and no upload is read
/// for it. Then the caller's share of requests in flight admits the request
/// or refuses it at once with 429 ([`admission`]): no tenant waits behind
/// another's requests, and `/healthz` behind none. Uploads stream to a file
/// and are limited in size (refused on their `Content-Length` before any
/// byte is read) and, per tenant, in bytes in flight; compiling them, in
/// number at once; every request, in time (the timeout is outermost: it
/// bounds everything a request does). The server under the router bounds
/// connections ([`server`]).
pub fn router(service: Arc<Service>, max_module_bytes: usize) -> Router {
    let uploads: axum::routing::MethodRouter<Arc<Service>> = post(push_module)
        // Uploads stream their body to a file themselves (see `receive_upload`).
        .layer::<_, std::convert::Infallible>(DefaultBodyLimit::disable());
    // The web dashboard: its pages and assets hold no data; its fragments
    // are authenticated like the API.
    let (dashboard_pages, dashboard_fragments) = crate::dashboard::routes();
    let authenticated = Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/tenants", post(create_tenant).get(list_tenants))
        .route("/v1/tenants/{name}/policy", put(set_policy))
        .route("/v1/tenants/{name}/token", post(rotate_token))
        .route("/v1/whoami", get(whoami))
        .route("/v1/modules", uploads.get(list_modules))
        .route("/v1/modules/{module}", get(get_module).delete(delete_module))
        .route("/v1/jobs", post(create_job).get(list_jobs))
        .route("/v1/jobs/{id}", get(get_job).delete(delete_job))
        .route("/v1/jobs/{id}/checkpoints", get(job_checkpoints))
        .route("/v1/jobs/{id}/logs", get(job_logs))
        .route("/v1/jobs/{id}/stop", post(stop_job))
        .route("/v1/jobs/{id}/resume", post(resume_job))
        .route("/v1/jobs/{id}/upgrade", post(upgrade_job))
        .route("/v1/jobs/{id}/scale", post(scale_job))
        .route("/v1/jobs/{id}/reset", post(reset_job))
        .route("/v1/operations/{id}", get(get_operation))
        .merge(dashboard_fragments)
        .route_layer(axum::middleware::from_fn_with_state(Arc::clone(&service), authenticate));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/openapi.json", get(openapi::serve))
        .merge(dashboard_pages)
        .merge(authenticated)
        .fallback(|| async { Failure::new(StatusCode::NOT_FOUND, "no such route; GET /openapi.json lists them") })
        .method_not_allowed_fallback(|| async {
            Failure::new(StatusCode::METHOD_NOT_ALLOWED, "this route does not take that method")
        })
        // JSON bodies: small.
        .layer(DefaultBodyLimit::max(1 << 20))
        .layer(Extension(UploadLimit::of_host(max_module_bytes)))
        .layer(Extension(CompileSlots(Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_COMPILES)))))
        .layer(Extension(Admission::default()))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, REQUEST_TIMEOUT))
        .with_state(service)
}

/// The longest a request may take, reading its body and compiling an
/// upload included.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);
/// What `Retry-After` says of a request refused for its caller's share:
/// most requests are answered within it.
const RETRY_AFTER_SECONDS: u32 = 1;
/// Uploads compiled at once (compiling takes a core and holds the module in
/// memory); more wait their turn. Receiving an upload takes no slot: a slow
/// client holds only its own request.
const MAX_CONCURRENT_COMPILES: usize = 2;

/// The bearer token of `headers`: the scheme is case-insensitive (RFC 9110).
fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim().to_owned())
}

/// Authenticates the request from its headers alone, before any extractor
/// parses its body, path or query, admits it under its caller's share (see
/// [`admission`]), and hands the [`Caller`] and its [`Share`] to the
/// handler. The turn is given back when the answer is ready.
async fn authenticate(
    State(service): State<Arc<Service>>,
    Extension(admission): Extension<Admission>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let token = bearer_token(request.headers());
    let authenticated = tokio::task::spawn_blocking(move || {
        let caller = service.authenticate(token.as_deref())?;
        let share = share_of(service.policy_of(&caller)?.as_ref());
        Ok((caller, share))
    })
    .await
    .map_err(|e| ServiceError::internal("the request's thread failed", e))
    .and_then(|authenticated| authenticated);
    let (caller, share) = match authenticated {
        Ok(authenticated) => authenticated,
        Err(e) => return Failure::from(e).into_response(),
    };
    let _turn = match admission.request(&caller, share) {
        Ok(turn) => turn,
        Err(refused) => return Failure::new(StatusCode::TOO_MANY_REQUESTS, refused.to_string()).into_response(),
    };
    request.extensions_mut().insert(caller);
    request.extensions_mut().insert(share);
    next.run(request).await
}

/// A caller's share of the control plane: its policy's, or the admin's.
fn share_of(policy: Option<&Policy>) -> Share {
    let Some(policy) = policy else { return admission::ADMIN_SHARE };
    Share {
        requests: policy.max_requests,
        // A stored policy was checked when it was set.
        upload_bytes: crate::units::parse_size(&policy.max_upload_bytes).map_or(0, |bytes| bytes as u64),
    }
}

/// The largest module upload, for `receive_upload`, and the rule that sets it.
#[derive(Clone, Copy)]
struct UploadLimit {
    bytes: usize,
    rule: &'static str,
}

impl UploadLimit {
    /// The host's own limit, `--max-module-size`.
    fn of_host(bytes: usize) -> UploadLimit {
        UploadLimit { bytes, rule: "this host's `--max-module-size`" }
    }

    /// 413 for an upload of `size` bytes.
    fn too_large(self, size: String) -> Failure {
        Failure::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the module is {size} bytes; {} accepts at most {}", self.rule, self.bytes),
        )
    }
}

/// Turns to compile an upload, shared by all tenants.
#[derive(Clone)]
struct CompileSlots(Arc<tokio::sync::Semaphore>);

/// Streams an upload of at most `limit` bytes into a file of the host,
/// hashing it on the way, so a slow or large upload holds no memory. One
/// without a `Content-Length` (chunked) is cut off where it passes the
/// limit; the caller refused one that declared more.
async fn receive_upload(service: &Service, body: axum::body::Body, limit: UploadLimit) -> Result<Upload, Failure> {
    use http_body_util::BodyExt as _;
    use sha2::Digest as _;
    use tokio::io::AsyncWriteExt as _;
    let file = service.new_upload_file()?;
    let io = |e: std::io::Error| Failure::from(ServiceError::internal("writing the upload", e));
    let mut writer = tokio::fs::File::from_std(file.as_file().try_clone().map_err(io)?);
    let mut hasher = sha2::Sha256::new();
    let mut size = 0u64;
    let mut body = body;
    let mut limited = http_body_util::Limited::new(&mut body, limit.bytes);
    while let Some(frame) = limited.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                discard_in_background(body);
                return Err(limit.too_large(format!("more than {}", limit.bytes)));
            }
            Err(e) => return Err(Failure::new(StatusCode::BAD_REQUEST, format!("reading the upload: {e}"))),
        };
        let Ok(chunk) = frame.into_data() else { continue };
        hasher.update(&chunk);
        size += chunk.len() as u64;
        writer.write_all(&chunk).await.map_err(io)?;
    }
    writer.flush().await.map_err(io)?;
    Ok(Upload { file, digest: hex::encode(hasher.finalize()), size })
}

/// A request's `Content-Length`, if it declares one.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

/// At most this much of a refused upload is read (and thrown away).
const DISCARD_BYTES: u64 = 64 << 20;
/// For at most this long.
const DISCARD_TIME: std::time::Duration = std::time::Duration::from_secs(30);

/// Reads and throws away what is left of a refused upload, bounded in bytes
/// and time, while the answer goes out: a client that sends its whole body
/// before it reads the answer (most do) then gets the 413 instead of a
/// connection reset mid-send. This is what web servers call a lingering
/// close; nothing read here is kept.
fn discard_in_background(body: axum::body::Body) {
    use http_body_util::BodyExt as _;
    tokio::spawn(async move {
        let mut body = body;
        let mut read = 0u64;
        let discard = async {
            while let Some(Ok(frame)) = body.frame().await {
                read += frame.data_ref().map_or(0, |data| data.len() as u64);
                if read > DISCARD_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(DISCARD_TIME, discard).await;
    });
}

/// The body of every error response.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApiError {
    /// What went wrong, and what to do about it when there is something.
    pub error: String,
}

/// An error response: a status and an [`ApiError`] body.
#[derive(Debug)]
pub(crate) struct Failure {
    status: StatusCode,
    message: String,
}

impl Failure {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Failure { status, message: message.into() }
    }

    /// What went wrong, as the body says it.
    pub(crate) fn message(&self) -> String {
        self.message.clone()
    }
}

impl From<ServiceError> for Failure {
    fn from(e: ServiceError) -> Self {
        let status = match &e {
            ServiceError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ServiceError::Forbidden(_) => StatusCode::FORBIDDEN,
            ServiceError::NotFound(_) => StatusCode::NOT_FOUND,
            ServiceError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ServiceError::Conflict(_) => StatusCode::CONFLICT,
            ServiceError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ServiceError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ServiceError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ServiceError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure::new(status, e.to_string())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(ApiError { error: self.message })).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}

/// [`axum::Json`] whose rejections (not `application/json`, bad syntax, the
/// wrong shape, too large) are [`ApiError`] bodies like every other error.
struct JsonBody<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for JsonBody<T> {
    type Rejection = Failure;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, Failure> {
        let mut value = match Json::<serde_json::Value>::from_request(request, state).await {
            Ok(Json(value)) => value,
            Err(rejection) => return Err(Failure::new(rejection.status(), rejection.body_text())),
        };
        integral_numbers_as_integers(&mut value);
        serde_path_to_error::deserialize(value).map(JsonBody).map_err(|e| {
            let message = match e.path().to_string() {
                path if path == "." => format!("the body: {}", e.inner()),
                path => format!("the body's `{path}`: {}", e.inner()),
            };
            Failure::new(StatusCode::UNPROCESSABLE_ENTITY, message)
        })
    }
}

/// Rewrites numbers with an integral value (`3.0`, `1e3`) as integers: JSON
/// Schema, and so the OpenAPI document, counts them as integers, and so
/// must the server.
fn integral_numbers_as_integers(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Number(number) => {
            if let Some(float) = number.as_f64().filter(|f| number.is_f64() && f.fract() == 0.0) {
                if float >= 0.0 && float <= u64::MAX as f64 {
                    *number = (float as u64).into();
                } else if float < 0.0 && float >= i64::MIN as f64 {
                    *number = (float as i64).into();
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers_as_integers),
        Value::Object(fields) => fields.values_mut().for_each(integral_numbers_as_integers),
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
}

/// [`axum::extract::Query`] whose rejection is an [`ApiError`] body.
struct QueryOf<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequestParts<S> for QueryOf<T> {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Failure> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(QueryOf(value)),
            Err(rejection) => Err(Failure::new(rejection.status(), rejection.body_text())),
        }
    }
}

/// [`axum::extract::Path`] whose rejection is an [`ApiError`] body.
struct PathOf<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> axum::extract::FromRequestParts<S> for PathOf<T> {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Failure> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(PathOf(value)),
            Err(rejection) => Err(Failure::new(rejection.status(), rejection.body_text())),
        }
    }
}

pub(crate) type ApiResult<T> = Result<T, Failure>;

/// Runs `call` for the authenticated `caller` on a blocking thread (the
/// service does disk and Kafka I/O and compiles modules).
pub(crate) async fn call<T: Send + 'static>(
    service: Arc<Service>,
    caller: Caller,
    call: impl FnOnce(&Arc<Service>, &Caller) -> Result<T, ServiceError> + Send + 'static,
) -> ApiResult<T> {
    let result = tokio::task::spawn_blocking(move || call(&service, &caller))
        .await
        .map_err(|e| ServiceError::internal("the request's thread failed", e))?;
    Ok(result?)
}

#[utoipa::path(get, path = "/metrics", tag = "admin",
    responses((status = 200, description = "OpenMetrics text", body = String,
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8")))]
async fn metrics(State(service): State<Arc<Service>>, Extension(caller): Extension<Caller>) -> ApiResult<Response> {
    let text = call(service, caller, |service, caller| {
        caller.admin()?;
        crate::service::render_metrics(service).map_err(|e| ServiceError::internal("encoding metrics", e))
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response())
}

/// `POST /v1/tenants`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct NewTenant {
    /// 1-40 lowercase letters, digits or `-`, not first.
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,39}$")]
    pub name: String,
    /// Default: topics prefixed `<name>.`, 10 jobs, 4 tasks each, 128 MiB,
    /// 2 s per call, 100 outputs per input, 256 MiB of state.
    pub policy: Option<Policy>,
}

/// A tenant with its token, which is shown only once.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantWithToken {
    /// The tenant.
    pub tenant: TenantRecord,
    /// The bearer token; store it now, the host keeps only its hash.
    pub token: String,
}

#[utoipa::path(post, path = "/v1/tenants", tag = "admin", request_body = NewTenant,
    responses((status = 201, body = TenantWithToken), (status = 400, body = ApiError), (status = 409, body = ApiError)))]
async fn create_tenant(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<NewTenant>,
) -> ApiResult<(StatusCode, Json<TenantWithToken>)> {
    let (tenant, token) = call(service, caller, move |s, c| s.create_tenant(c, &body.name, body.policy)).await?;
    Ok((StatusCode::CREATED, Json(TenantWithToken { tenant, token })))
}

#[utoipa::path(get, path = "/v1/tenants", tag = "admin", responses((status = 200, body = Vec<TenantRecord>)))]
async fn list_tenants(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<Vec<TenantRecord>>> {
    Ok(Json(call(service, caller, |s, c| s.tenants(c)).await?))
}

#[utoipa::path(put, path = "/v1/tenants/{name}/policy", tag = "admin", request_body = Policy,
    params(("name" = String, Path)), responses((status = 200, body = TenantRecord), (status = 404, body = ApiError)))]
async fn set_policy(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(name): PathOf<String>,
    JsonBody(policy): JsonBody<Policy>,
) -> ApiResult<Json<TenantRecord>> {
    Ok(Json(call(service, caller, move |s, c| s.set_policy(c, &name, policy)).await?))
}

#[utoipa::path(post, path = "/v1/tenants/{name}/token", tag = "admin",
    params(("name" = String, Path)), responses((status = 200, body = TenantWithToken), (status = 404, body = ApiError)))]
async fn rotate_token(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(name): PathOf<String>,
) -> ApiResult<Json<TenantWithToken>> {
    let (tenant, token) = call(service, caller, move |s, c| s.rotate_token(c, &name)).await?;
    Ok(Json(TenantWithToken { tenant, token }))
}

#[utoipa::path(get, path = "/v1/whoami", tag = "tenant", responses((status = 200, body = TenantRecord)))]
async fn whoami(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<TenantRecord>> {
    Ok(Json(call(service, caller, |s, c| s.whoami(c)).await?))
}

/// `?name=` of an upload.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ModuleName {
    /// A name for humans and job specs, 1-100 characters without `/` or
    /// control characters; default: the digest's first 12 digits.
    #[param(pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]{1,100}$")]
    pub name: Option<String>,
}

#[utoipa::path(post, path = "/v1/modules", tag = "tenant", params(ModuleName),
    request_body(content = Vec<u8>, content_type = "application/octet-stream",
        description = "the component's bytes (the server reads any content type; `application/wasm` is usual)"),
    responses(
        (status = 201, body = ModuleRecord, description = "validated against the sluice world and compiled"),
        (status = 413, body = ApiError, description = "over the host's module size limit"),
        (status = 422, body = ApiError, description = "not a component of the sluice world; the message says why"),
    ))]
#[allow(clippy::too_many_arguments)] // axum extractors, one per argument
async fn push_module(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    Extension(share): Extension<Share>,
    Extension(admission): Extension<Admission>,
    QueryOf(query): QueryOf<ModuleName>,
    Extension(limit): Extension<UploadLimit>,
    Extension(CompileSlots(compiles)): Extension<CompileSlots>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> ApiResult<(StatusCode, Json<ModuleRecord>)> {
    // The admin has no modules: refused as such, not by its (empty) share.
    caller.tenant()?;
    // The tighter of the host's limit and the tenant's share bounds the body.
    let limit = if share.upload_bytes < limit.bytes as u64 {
        UploadLimit { bytes: share.upload_bytes as usize, rule: "your policy's `max-upload-bytes`" }
    } else {
        limit
    };
    // Held until the module is stored or refused: its file and its compile
    // are the tenant's until then.
    let size = match declared_length(&headers) {
        Some(declared) if declared > limit.bytes as u64 => {
            discard_in_background(body);
            return Err(limit.too_large(declared.to_string()));
        }
        Some(declared) => declared,
        None => limit.bytes as u64,
    };
    let _bytes = admission
        .upload(&caller, share, size)
        .map_err(|refused| Failure::new(StatusCode::TOO_MANY_REQUESTS, refused.to_string()))?;
    let upload = receive_upload(&service, body, limit).await?;
    let _turn = compiles.acquire_owned().await.map_err(|e| ServiceError::internal("waiting to compile", e))?;
    let module = call(service, caller, move |s, c| s.push_module(c, query.name.as_deref(), upload)).await?;
    Ok((StatusCode::CREATED, Json(module)))
}

#[utoipa::path(get, path = "/v1/modules", tag = "tenant", responses((status = 200, body = Vec<ModuleRecord>)))]
async fn list_modules(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<Vec<ModuleRecord>>> {
    Ok(Json(call(service, caller, |s, c| s.modules(c)).await?))
}

#[utoipa::path(get, path = "/v1/modules/{module}", tag = "tenant", params(("module" = String, Path, description = "digest, digest prefix (8+) or name")),
    responses((status = 200, body = ModuleRecord), (status = 404, body = ApiError)))]
async fn get_module(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(module): PathOf<String>,
) -> ApiResult<Json<ModuleRecord>> {
    Ok(Json(call(service, caller, move |s, c| s.module(c, &module)).await?))
}

#[utoipa::path(delete, path = "/v1/modules/{module}", tag = "tenant", params(("module" = String, Path)),
    responses((status = 204), (status = 404, body = ApiError), (status = 409, body = ApiError, description = "a job uses it")))]
async fn delete_module(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(module): PathOf<String>,
) -> ApiResult<StatusCode> {
    call(service, caller, move |s, c| s.delete_module(c, &module)).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/jobs", tag = "tenant", request_body = crate::job::JobSpec,
    responses(
        (status = 201, body = JobStatus),
        (status = 400, body = ApiError, description = "the spec does not have the documented shape; the message names the field"),
        (status = 401, body = ApiError, description = "no valid token"),
        (status = 403, body = ApiError, description = "the tenant's policy does not allow it"),
        (status = 404, body = ApiError, description = "no such module"),
        (status = 409, body = ApiError, description = "the job exists, or a control operation on it is under way"),
        (status = 422, body = ApiError, description = "well-formed but refused: fields that do not fit together (named), or a topic that does not exist"),
        (status = 503, body = ApiError, description = "Kafka cannot be reached or cannot answer now; try again"),
    ))]
async fn create_job(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    JsonBody(spec): JsonBody<serde_json::Value>,
) -> ApiResult<(StatusCode, Json<JobStatus>)> {
    let status = call(service, caller, move |s, c| s.create_job(c, spec)).await?;
    Ok((StatusCode::CREATED, Json(status)))
}

#[utoipa::path(get, path = "/v1/jobs", tag = "tenant", responses((status = 200, body = Vec<JobStatus>)))]
async fn list_jobs(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<Vec<JobStatus>>> {
    Ok(Json(call(service, caller, |s, c| s.jobs(c)).await?))
}

#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "tenant", params(("id" = String, Path)),
    responses((status = 200, body = JobStatus), (status = 404, body = ApiError)))]
async fn get_job(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(id): PathOf<String>,
) -> ApiResult<Json<JobStatus>> {
    Ok(Json(call(service, caller, move |s, c| s.job_status(c, &id)).await?))
}

#[utoipa::path(get, path = "/v1/jobs/{id}/checkpoints", tag = "tenant", params(("id" = String, Path)),
    responses((status = 200, body = Vec<crate::service::TaskView>, description = "per task: last checkpoint, its transaction"), (status = 404, body = ApiError)))]
async fn job_checkpoints(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(id): PathOf<String>,
) -> ApiResult<Json<Vec<crate::service::TaskView>>> {
    Ok(Json(call(service, caller, move |s, c| s.job_status(c, &id).map(|status| status.tasks)).await?))
}

#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "tenant", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ApiError),
        (status = 409, body = ApiError, description = "it should run (stop it first), or another control operation is under way"),
        (status = 503, body = ApiError, description = "Kafka cannot be reached or cannot answer now; the job is still there: try again")))]
async fn delete_job(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(id): PathOf<String>,
) -> ApiResult<StatusCode> {
    call(service, caller, move |s, c| s.delete_job(c, &id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `?after=&limit=` of a log read.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct LogQuery {
    /// Only lines numbered above this (the last `seq` seen); default 0.
    pub after: Option<u64>,
    /// At most this many lines; default 500.
    pub limit: Option<usize>,
}

#[utoipa::path(get, path = "/v1/jobs/{id}/logs", tag = "tenant", params(("id" = String, Path), LogQuery),
    responses((status = 200, body = Vec<LogLine>), (status = 404, body = ApiError)))]
async fn job_logs(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(id): PathOf<String>,
    QueryOf(query): QueryOf<LogQuery>,
) -> ApiResult<Json<Vec<LogLine>>> {
    let (after, limit) = (query.after.unwrap_or(0), query.limit.unwrap_or(500).min(5000));
    Ok(Json(call(service, caller, move |s, c| s.job_logs(c, &id, after, limit)).await?))
}

#[utoipa::path(post, path = "/v1/jobs/{id}/stop", tag = "tenant", params(("id" = String, Path)),
    responses((status = 202, body = Operation, description = "the job takes a final checkpoint, then stops"), (status = 404, body = ApiError),
        (status = 409, body = ApiError, description = "another control operation on the job is under way")))]
async fn stop_job(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(id): PathOf<String>,
) -> ApiResult<(StatusCode, Json<Operation>)> {
    let operation = call(service, caller, move |s, c| s.stop_job(c, &id)).await?;
    Ok((StatusCode::ACCEPTED, Json(operation)))
}

#[utoipa::path(post, path = "/v1/jobs/{id}/resume", tag = "tenant", params(("id" = String, Path)),
    responses((status = 200, body = JobStatus), (status = 404, body = ApiError),
        (status = 403, body = ApiError, description = "its tasks would be over the policy's `max-tasks`"),
        (status = 409, body = ApiError, description = "running, a control operation is under way, or another of \
            the tenant's jobs changed while its tasks were counted (try again)"),
        (status = 422, body = ApiError, description = "the stored spec no longer fits the host (the message says why)")))]
async fn resume_job(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(id): PathOf<String>,
) -> ApiResult<Json<JobStatus>> {
    Ok(Json(call(service, caller, move |s, c| s.resume_job(c, &id)).await?))
}

/// `POST /v1/jobs/{id}/upgrade`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct Upgrade {
    /// The new module: digest, digest prefix or name.
    pub module: String,
}

#[utoipa::path(post, path = "/v1/jobs/{id}/upgrade", tag = "tenant", params(("id" = String, Path)), request_body = Upgrade,
    responses((status = 202, body = Operation, description = "stops with a final checkpoint, then runs the new module over the same state"),
        (status = 404, body = ApiError, description = "no such job or module"),
        (status = 409, body = ApiError, description = "the job already runs that module, is stopping, or another control operation is under way")))]
async fn upgrade_job(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(id): PathOf<String>,
    JsonBody(body): JsonBody<Upgrade>,
) -> ApiResult<(StatusCode, Json<Operation>)> {
    let operation = call(service, caller, move |s, c| s.upgrade_job(c, &id, &body.module)).await?;
    Ok((StatusCode::ACCEPTED, Json(operation)))
}

/// `POST /v1/jobs/{id}/scale`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Scale {
    /// The number of tasks; at most the input's partition count is used.
    #[schema(minimum = 1)]
    pub parallelism: u32,
}

#[utoipa::path(post, path = "/v1/jobs/{id}/scale", tag = "tenant", params(("id" = String, Path)), request_body = Scale,
    responses((status = 202, body = Operation, description = "stops with a final checkpoint, moves each shard's state to its new task, and starts again; a stopped job keeps the new parallelism for its next start"),
        (status = 403, body = ApiError, description = "over the tenant's policy (parallelism or tasks at once)"),
        (status = 404, body = ApiError, description = "no such job"),
        (status = 409, body = ApiError, description = "the job is stopping, or another control operation is under way"),
        (status = 422, body = ApiError, description = "the parallelism is out of range")))]
async fn scale_job(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(id): PathOf<String>,
    JsonBody(body): JsonBody<Scale>,
) -> ApiResult<(StatusCode, Json<Operation>)> {
    let operation = call(service, caller, move |s, c| s.scale_job(c, &id, body.parallelism)).await?;
    Ok((StatusCode::ACCEPTED, Json(operation)))
}

/// `POST /v1/jobs/{id}/reset`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Reset {
    /// `earliest`, `latest`, or a time: milliseconds since the Unix epoch,
    /// or RFC 3339 (`2026-12-01T10:00:00Z`); the job then reads each input
    /// partition from its first record at or after that time.
    #[schema(
        pattern = "^(earliest|latest|[0-9]{1,15}|[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2}))$"
    )]
    pub to: String,
    /// `keep` the state (reprocessed records apply over it) or `clear` it.
    pub state: ResetState,
}

/// What `to` of a reset means.
fn reset_to(to: &str) -> Result<crate::kafka::ResetTo, Failure> {
    use crate::kafka::ResetTo;
    let refuse = |why: String| Failure::new(StatusCode::UNPROCESSABLE_ENTITY, format!("`to = {to:?}`: {why}"));
    match to {
        "earliest" => Ok(ResetTo::Earliest),
        "latest" => Ok(ResetTo::Latest),
        millis if millis.bytes().all(|b| b.is_ascii_digit()) => {
            millis.parse().map(ResetTo::Timestamp).map_err(|e| refuse(format!("{e}")))
        }
        time => {
            let at = humantime::parse_rfc3339_weak(time).map_err(|e| refuse(format!("not an RFC 3339 time: {e}")))?;
            let millis =
                at.duration_since(std::time::UNIX_EPOCH).map_err(|_| refuse("before 1970".into()))?.as_millis();
            i64::try_from(millis).map(ResetTo::Timestamp).map_err(|e| refuse(format!("{e}")))
        }
    }
}

#[utoipa::path(post, path = "/v1/jobs/{id}/reset", tag = "tenant", params(("id" = String, Path)), request_body = Reset,
    responses((status = 200, body = JobStatus, description = "the positions moved; resume the job to reprocess"),
        (status = 404, body = ApiError),
        (status = 409, body = ApiError, description = "the job runs, or another control operation is under way"),
        (status = 422, body = ApiError, description = "`to` is not a time, or the state cannot be kept (the message says why)"),
        (status = 503, body = ApiError, description = "Kafka cannot be reached or cannot answer now; try again")))]
async fn reset_job(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(id): PathOf<String>,
    JsonBody(body): JsonBody<Reset>,
) -> ApiResult<Json<JobStatus>> {
    let to = reset_to(&body.to)?;
    Ok(Json(call(service, caller, move |s, c| s.reset_job(c, &id, to, body.state)).await?))
}

#[utoipa::path(get, path = "/v1/operations/{id}", tag = "tenant", params(("id" = String, Path)),
    responses((status = 200, body = Operation), (status = 404, body = ApiError)))]
async fn get_operation(
    State(service): State<Arc<Service>>,
    Extension(caller): Extension<Caller>,
    PathOf(id): PathOf<String>,
) -> ApiResult<Json<Operation>> {
    Ok(Json(call(service, caller, move |s, c| s.operation(c, &id)).await?))
}
