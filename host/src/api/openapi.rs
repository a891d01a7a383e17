//! The OpenAPI document of the API, generated from the handlers' and types'
//! annotations so it cannot drift from the code.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
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
        super::stop_job, super::resume_job, super::upgrade_job, super::get_operation,
    ),
    modifiers(&BearerAuth),
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
