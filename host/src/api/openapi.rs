//! The OpenAPI document of the API, generated from the handlers' and types'
//! annotations so it cannot drift from the code.

use axum::Json;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(title = "sluice", description = "Exactly-once Kafka pipelines whose transforms are WebAssembly components: \
        the control plane of `sluice serve`. Every call but /healthz and /openapi.json needs \
        `Authorization: Bearer <token>`: the admin token for /metrics and /v1/tenants, a tenant's token for the rest."),
    paths(
        super::metrics, super::create_tenant, super::list_tenants, super::set_policy, super::rotate_token, super::whoami,
        super::push_module, super::list_modules, super::get_module, super::delete_module,
        super::create_job, super::list_jobs, super::get_job, super::job_checkpoints, super::delete_job, super::job_logs,
        super::stop_job, super::resume_job, super::upgrade_job, super::scale_job, super::reset_job, super::get_operation,
    ),
    components(schemas(super::ApiError)),
    modifiers(&BearerAuth, &CommonResponses),
    security(("bearer" = [])),
)]
pub(crate) struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Adds the answers every route of a kind can give, so no route's list
/// misses one: 401 without a valid token, 403 with the other kind of token
/// (admin or tenant), 429 past the caller's share of requests in flight,
/// and for JSON bodies the parser's 400, 413, 415 and
/// 422; each with the [`ApiError`](super::ApiError) body.
struct CommonResponses;

fn error(description: &str) -> RefOr<Response> {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ApiError"))).build();
    RefOr::T(ResponseBuilder::new().description(description).content("application/json", content).build())
}

fn add(operation: &mut Operation, status: &str, description: &str) {
    operation.responses.responses.entry(status.to_owned()).or_insert_with(|| error(description));
}

impl Modify for CommonResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            let operations = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
            for operation in operations.into_iter().flatten() {
                add(operation, "401", "no valid token");
                add(
                    operation,
                    "429",
                    "the caller has as many requests (or upload bytes) in flight as its policy allows; \
                     `Retry-After` says when to try again",
                );
                let admin = operation.tags.iter().flatten().any(|tag| tag == "admin");
                add(operation, "403", if admin { "not the admin token" } else { "not a tenant's token" });
                let json_body =
                    operation.request_body.as_ref().is_some_and(|body| body.content.contains_key("application/json"));
                if json_body {
                    add(operation, "400", "the body is not JSON");
                    add(operation, "413", "the body is over 1 MiB");
                    add(operation, "415", "the body is not `Content-Type: application/json`");
                    add(operation, "422", "the body does not have the documented shape; the message names the field");
                }
            }
        }
    }
}

pub(super) async fn serve() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_of_the_router_is_documented() {
        let doc = ApiDoc::openapi();
        let documented: Vec<&str> = doc.paths.paths.keys().map(String::as_str).collect();
        // The routes of `router`, but for /healthz and /openapi.json.
        let source = include_str!("mod.rs");
        for line in source.lines().filter(|l| l.trim_start().starts_with(".route(\"")) {
            let path = line.split('"').nth(1).unwrap_or_default();
            if path == "/healthz" || path == "/openapi.json" {
                continue;
            }
            assert!(documented.contains(&path), "route {path} is not in the OpenAPI document");
        }
        assert!(documented.len() >= 15, "{documented:?}");
    }
}
