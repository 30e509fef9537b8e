//! An HTTP client for the orders API.

use std::time::Duration;

use reqwest::StatusCode;

pub const ORDER: &str = r#"{"items":[{"id":42,"quantity":1}],"currency":"RUB","amount":1500}"#;

/// The `Content-Type` of a JSON body.
const JSON: (&str, &str) = ("content-type", "application/json");

/// A response, read whole: the workspace's one `Answer`.
pub use idemgate_testkit::Answer;

/// One client identity: a bearer token.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    pub token: String,
}

impl Client {
    pub fn new() -> Self {
        Self::with_timeout(Duration::from_secs(30))
    }

    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            http: reqwest::Client::builder().timeout(timeout).build().unwrap(),
            token: format!("token-{}", uuid::Uuid::new_v4()),
        }
    }

    pub fn with_token(&self, token: &str) -> Self {
        Self {
            http: self.http.clone(),
            token: token.to_owned(),
        }
    }

    pub async fn try_post(
        &self,
        url: &str,
        key: Option<&str>,
        body: &str,
    ) -> reqwest::Result<Answer> {
        self.try_send(reqwest::Method::POST, url, key, &[JSON], Some(body))
            .await
    }

    /// Any method, JSON body, extra headers (a key elsewhere than
    /// `Idempotency-Key`, say).
    pub async fn try_send_json(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> reqwest::Result<Answer> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let headers: Vec<(&str, &str)> = std::iter::once(JSON)
            .chain(headers.iter().copied())
            .collect();
        self.try_send(method, url, None, &headers, Some(body)).await
    }

    pub async fn send_json(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        self.try_send_json(method, url, headers, body)
            .await
            .expect(method)
    }

    pub async fn post(&self, url: &str, key: Option<&str>, body: &str) -> Answer {
        self.try_post(url, key, body).await.expect("POST")
    }

    pub async fn get(&self, url: &str) -> Answer {
        self.try_send(reqwest::Method::GET, url, None, &[], None)
            .await
            .expect("GET")
    }

    /// Any request: `method` to `url` with an optional key, extra headers and a
    /// JSON (or other, per the headers) body.
    pub async fn send(
        &self,
        method: reqwest::Method,
        url: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Answer {
        self.try_send(method, url, key, headers, body)
            .await
            .expect("request")
    }

    /// [`Client::send`], with the transport's error (a lost response) returned.
    pub async fn try_send(
        &self,
        method: reqwest::Method,
        url: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> reqwest::Result<Answer> {
        let mut request = self.http.request(method, url).bearer_auth(&self.token);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.body(body.to_owned());
        }
        let response = request.send().await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// This client's orders, through the API.
    pub async fn orders(&self, base: &str) -> Vec<serde_json::Value> {
        let answer = self.get(&format!("{base}/api/v1/orders")).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        answer.json()["orders"].as_array().unwrap().clone()
    }
}

pub fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}
