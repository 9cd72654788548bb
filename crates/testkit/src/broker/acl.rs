//! Creating ACLs on a running cluster in one admin request: librdkafka's
//! `rd_kafka_CreateAcls`, which rust-rdkafka does not wrap. The other way,
//! Kafka's `kafka-acls.sh`, starts a JVM for each principal and resource
//! set — seconds per call on two cores, for every test stack.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::ClientConfig;

/// What an ACL is on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    /// A topic, by its literal name.
    Topic(String),
    /// A consumer group, by its literal name.
    Group(String),
}

/// An operation an ACL allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    /// Consume (a topic), join and commit offsets (a group).
    Read,
    /// Produce.
    Write,
    /// Create the topic.
    Create,
    /// Metadata, offsets and watermarks.
    Describe,
    /// Read the topic's settings.
    DescribeConfigs,
    /// Change the topic's settings.
    AlterConfigs,
}

impl Operation {
    /// The name `kafka-acls.sh --operation` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "Read",
            Self::Write => "Write",
            Self::Create => "Create",
            Self::Describe => "Describe",
            Self::DescribeConfigs => "DescribeConfigs",
            Self::AlterConfigs => "AlterConfigs",
        }
    }

    fn code(self) -> rd::rd_kafka_AclOperation_t {
        use rd::rd_kafka_AclOperation_t::*;
        match self {
            Self::Read => RD_KAFKA_ACL_OPERATION_READ,
            Self::Write => RD_KAFKA_ACL_OPERATION_WRITE,
            Self::Create => RD_KAFKA_ACL_OPERATION_CREATE,
            Self::Describe => RD_KAFKA_ACL_OPERATION_DESCRIBE,
            Self::DescribeConfigs => RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
            Self::AlterConfigs => RD_KAFKA_ACL_OPERATION_ALTER_CONFIGS,
        }
    }
}

/// One allow rule: `principal` (a user name, `User:` added) may do
/// `operation` on `resource`, from any host.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Acl {
    /// The SCRAM user name.
    pub principal: String,
    /// What it is on.
    pub resource: Resource,
    /// What it allows.
    pub operation: Operation,
}

/// Creates `acls` through the client `config` makes (a super user's),
/// waiting up to `timeout`; fails naming the first rule the broker refused.
pub fn create(config: &ClientConfig, acls: &[Acl], timeout: Duration) -> anyhow::Result<()> {
    let client: BaseConsumer = config.create()?;
    let rk = client.client().native_ptr();
    let mut bindings = Vec::with_capacity(acls.len());
    for acl in acls {
        bindings.push(binding(acl)?);
    }
    // SAFETY: `rk` lives as long as `client`; every binding was made by
    // rd_kafka_AclBinding_new and is destroyed once, below; the queue,
    // the options and the event are destroyed after their last use.
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        let options = rd::rd_kafka_AdminOptions_new(rk, rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_CREATEACLS);
        let mut errstr = [0 as std::ffi::c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options,
            timeout.as_millis().try_into().unwrap_or(i32::MAX),
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        rd::rd_kafka_CreateAcls(rk, bindings.as_mut_ptr(), bindings.len(), options, queue);
        let event = rd::rd_kafka_queue_poll(queue, (timeout + Duration::from_secs(5)).as_millis() as i32);
        let outcome = outcome(event, acls);
        if !event.is_null() {
            rd::rd_kafka_event_destroy(event);
        }
        rd::rd_kafka_AdminOptions_destroy(options);
        rd::rd_kafka_queue_destroy(queue);
        rd::rd_kafka_AclBinding_destroy_array(bindings.as_mut_ptr(), bindings.len());
        outcome
    }
}

/// The result of a CreateAcls `event`: the request's error, or the first
/// rule's.
///
/// # Safety
/// `event` is null or the CreateAcls result event of `acls`' request.
unsafe fn outcome(event: *mut rd::rd_kafka_event_t, acls: &[Acl]) -> anyhow::Result<()> {
    anyhow::ensure!(!event.is_null(), "no answer to CreateAcls");
    unsafe {
        if rd::rd_kafka_event_error(event) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            let why = CStr::from_ptr(rd::rd_kafka_event_error_string(event)).to_string_lossy();
            anyhow::bail!("CreateAcls failed: {why}");
        }
        let result = rd::rd_kafka_event_CreateAcls_result(event);
        anyhow::ensure!(!result.is_null(), "CreateAcls answered with another event");
        let mut n = 0usize;
        let results = rd::rd_kafka_CreateAcls_result_acls(result, &mut n);
        anyhow::ensure!(
            n == acls.len(),
            "CreateAcls answered {n} results for {} rules",
            acls.len()
        );
        for (i, acl) in acls.iter().enumerate() {
            let error = rd::rd_kafka_acl_result_error(*results.add(i));
            if !error.is_null() {
                let why = CStr::from_ptr(rd::rd_kafka_error_string(error)).to_string_lossy();
                anyhow::bail!("the broker refused {acl:?}: {why}");
            }
        }
    }
    Ok(())
}

fn binding(acl: &Acl) -> anyhow::Result<*mut rd::rd_kafka_AclBinding_t> {
    let (restype, name) = match &acl.resource {
        Resource::Topic(t) => (rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_TOPIC, t),
        Resource::Group(g) => (rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_GROUP, g),
    };
    let name = CString::new(name.as_str())?;
    let principal = CString::new(format!("User:{}", acl.principal))?;
    let host = CString::new("*")?;
    let mut errstr = [0 as std::ffi::c_char; 256];
    // SAFETY: every string is a live NUL-terminated CString for the call;
    // errstr is a writable buffer of the length passed.
    let binding = unsafe {
        rd::rd_kafka_AclBinding_new(
            restype,
            name.as_ptr(),
            rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_LITERAL,
            principal.as_ptr(),
            host.as_ptr(),
            acl.operation.code(),
            rd::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW,
            errstr.as_mut_ptr(),
            errstr.len(),
        )
    };
    if binding.is_null() {
        // SAFETY: librdkafka wrote a NUL-terminated message into errstr.
        let why = unsafe { CStr::from_ptr(errstr.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        anyhow::bail!("invalid ACL {acl:?}: {why}");
    }
    Ok(binding)
}
