from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Scope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCOPE_UNSPECIFIED: _ClassVar[Scope]
    SCOPE_SELF: _ClassVar[Scope]
    SCOPE_SYSTEM: _ClassVar[Scope]
    SCOPE_JOB: _ClassVar[Scope]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_PERMISSION_DENIED: _ClassVar[ErrorCode]
    ERROR_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_RESOURCE_EXHAUSTED: _ClassVar[ErrorCode]
    ERROR_UNAVAILABLE: _ClassVar[ErrorCode]
    ERROR_AUDIT_FAILED: _ClassVar[ErrorCode]
    ERROR_HASH_MISMATCH: _ClassVar[ErrorCode]
    ERROR_UNAUTHENTICATED: _ClassVar[ErrorCode]
    ERROR_KERNEL: _ClassVar[ErrorCode]
    ERROR_INTERNAL: _ClassVar[ErrorCode]
    ERROR_PROTOCOL: _ClassVar[ErrorCode]
SCOPE_UNSPECIFIED: Scope
SCOPE_SELF: Scope
SCOPE_SYSTEM: Scope
SCOPE_JOB: Scope
ERROR_UNSPECIFIED: ErrorCode
ERROR_INVALID_ARGUMENT: ErrorCode
ERROR_PERMISSION_DENIED: ErrorCode
ERROR_NOT_FOUND: ErrorCode
ERROR_RESOURCE_EXHAUSTED: ErrorCode
ERROR_UNAVAILABLE: ErrorCode
ERROR_AUDIT_FAILED: ErrorCode
ERROR_HASH_MISMATCH: ErrorCode
ERROR_UNAUTHENTICATED: ErrorCode
ERROR_KERNEL: ErrorCode
ERROR_INTERNAL: ErrorCode
ERROR_PROTOCOL: ErrorCode

class Error(_message.Message):
    __slots__ = ("code", "message", "rule")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    rule: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., rule: _Optional[str] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("protocol", "client_version")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    CLIENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol: int
    client_version: str
    def __init__(self, protocol: _Optional[int] = ..., client_version: _Optional[str] = ...) -> None: ...

class Features(_message.Message):
    __slots__ = ("direct_map_reads", "bpf_stats")
    DIRECT_MAP_READS_FIELD_NUMBER: _ClassVar[int]
    BPF_STATS_FIELD_NUMBER: _ClassVar[int]
    direct_map_reads: bool
    bpf_stats: bool
    def __init__(self, direct_map_reads: _Optional[bool] = ..., bpf_stats: _Optional[bool] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("protocol", "broker_version", "kernel_release", "features", "uid", "gid", "pid", "possible_cpus")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    BROKER_VERSION_FIELD_NUMBER: _ClassVar[int]
    KERNEL_RELEASE_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    POSSIBLE_CPUS_FIELD_NUMBER: _ClassVar[int]
    protocol: int
    broker_version: str
    kernel_release: str
    features: Features
    uid: int
    gid: int
    pid: int
    possible_cpus: int
    def __init__(self, protocol: _Optional[int] = ..., broker_version: _Optional[str] = ..., kernel_release: _Optional[str] = ..., features: _Optional[_Union[Features, _Mapping]] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., pid: _Optional[int] = ..., possible_cpus: _Optional[int] = ...) -> None: ...

class ListProgramsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProgramListing(_message.Message):
    __slots__ = ("name", "description", "sha256", "scopes", "available", "unavailable_reason", "attach_points", "libraries", "parameters", "maps", "requires")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    ATTACH_POINTS_FIELD_NUMBER: _ClassVar[int]
    LIBRARIES_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    MAPS_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    sha256: str
    scopes: _containers.RepeatedScalarFieldContainer[Scope]
    available: bool
    unavailable_reason: str
    attach_points: _containers.RepeatedScalarFieldContainer[str]
    libraries: _containers.RepeatedScalarFieldContainer[str]
    parameters: _containers.RepeatedCompositeFieldContainer[ParameterDescription]
    maps: _containers.RepeatedCompositeFieldContainer[MapDescription]
    requires: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., sha256: _Optional[str] = ..., scopes: _Optional[_Iterable[_Union[Scope, str]]] = ..., available: _Optional[bool] = ..., unavailable_reason: _Optional[str] = ..., attach_points: _Optional[_Iterable[str]] = ..., libraries: _Optional[_Iterable[str]] = ..., parameters: _Optional[_Iterable[_Union[ParameterDescription, _Mapping]]] = ..., maps: _Optional[_Iterable[_Union[MapDescription, _Mapping]]] = ..., requires: _Optional[str] = ...) -> None: ...

class ParameterDescription(_message.Message):
    __slots__ = ("name", "type", "required", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    required: bool
    description: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., required: _Optional[bool] = ..., description: _Optional[str] = ...) -> None: ...

class ListProgramsReply(_message.Message):
    __slots__ = ("programs",)
    PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    programs: _containers.RepeatedCompositeFieldContainer[ProgramListing]
    def __init__(self, programs: _Optional[_Iterable[_Union[ProgramListing, _Mapping]]] = ...) -> None: ...

class AttachParams(_message.Message):
    __slots__ = ("pid", "library", "functions", "library_fd_index", "frequency", "children", "python_files", "python_frames", "min_block_us", "stack_bytes", "job", "sample_bytes")
    PID_FIELD_NUMBER: _ClassVar[int]
    LIBRARY_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    LIBRARY_FD_INDEX_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FILES_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FRAMES_FIELD_NUMBER: _ClassVar[int]
    MIN_BLOCK_US_FIELD_NUMBER: _ClassVar[int]
    STACK_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    pid: int
    library: str
    functions: _containers.RepeatedScalarFieldContainer[str]
    library_fd_index: int
    frequency: int
    children: bool
    python_files: _containers.RepeatedCompositeFieldContainer[PythonFile]
    python_frames: int
    min_block_us: int
    stack_bytes: int
    job: str
    sample_bytes: int
    def __init__(self, pid: _Optional[int] = ..., library: _Optional[str] = ..., functions: _Optional[_Iterable[str]] = ..., library_fd_index: _Optional[int] = ..., frequency: _Optional[int] = ..., children: _Optional[bool] = ..., python_files: _Optional[_Iterable[_Union[PythonFile, _Mapping]]] = ..., python_frames: _Optional[int] = ..., min_block_us: _Optional[int] = ..., stack_bytes: _Optional[int] = ..., job: _Optional[str] = ..., sample_bytes: _Optional[int] = ...) -> None: ...

class PythonFile(_message.Message):
    __slots__ = ("dev", "ino", "runtime_off", "major", "minor", "library", "free_threaded")
    DEV_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_OFF_FIELD_NUMBER: _ClassVar[int]
    MAJOR_FIELD_NUMBER: _ClassVar[int]
    MINOR_FIELD_NUMBER: _ClassVar[int]
    LIBRARY_FIELD_NUMBER: _ClassVar[int]
    FREE_THREADED_FIELD_NUMBER: _ClassVar[int]
    dev: int
    ino: int
    runtime_off: int
    major: int
    minor: int
    library: bool
    free_threaded: bool
    def __init__(self, dev: _Optional[int] = ..., ino: _Optional[int] = ..., runtime_off: _Optional[int] = ..., major: _Optional[int] = ..., minor: _Optional[int] = ..., library: _Optional[bool] = ..., free_threaded: _Optional[bool] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("name", "object", "scope", "params", "lease_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    object: bytes
    scope: Scope
    params: AttachParams
    lease_seconds: int
    def __init__(self, name: _Optional[str] = ..., object: _Optional[bytes] = ..., scope: _Optional[_Union[Scope, str]] = ..., params: _Optional[_Union[AttachParams, _Mapping]] = ..., lease_seconds: _Optional[int] = ...) -> None: ...

class MapDescription(_message.Message):
    __slots__ = ("name", "show", "unit", "key_label", "description", "map_type", "key_size", "value_size", "max_entries", "per_cpu", "fd_index", "btf_key_type_id", "btf_value_type_id", "event_type", "btf_event_type_id", "metrics", "metrics_listed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHOW_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    KEY_LABEL_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    MAP_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    PER_CPU_FIELD_NUMBER: _ClassVar[int]
    FD_INDEX_FIELD_NUMBER: _ClassVar[int]
    BTF_KEY_TYPE_ID_FIELD_NUMBER: _ClassVar[int]
    BTF_VALUE_TYPE_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    BTF_EVENT_TYPE_ID_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    METRICS_LISTED_FIELD_NUMBER: _ClassVar[int]
    name: str
    show: str
    unit: str
    key_label: str
    description: str
    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    per_cpu: bool
    fd_index: int
    btf_key_type_id: int
    btf_value_type_id: int
    event_type: str
    btf_event_type_id: int
    metrics: _containers.RepeatedScalarFieldContainer[str]
    metrics_listed: bool
    def __init__(self, name: _Optional[str] = ..., show: _Optional[str] = ..., unit: _Optional[str] = ..., key_label: _Optional[str] = ..., description: _Optional[str] = ..., map_type: _Optional[int] = ..., key_size: _Optional[int] = ..., value_size: _Optional[int] = ..., max_entries: _Optional[int] = ..., per_cpu: _Optional[bool] = ..., fd_index: _Optional[int] = ..., btf_key_type_id: _Optional[int] = ..., btf_value_type_id: _Optional[int] = ..., event_type: _Optional[str] = ..., btf_event_type_id: _Optional[int] = ..., metrics: _Optional[_Iterable[str]] = ..., metrics_listed: _Optional[bool] = ...) -> None: ...

class ProgramDescription(_message.Message):
    __slots__ = ("name", "section", "prog_type", "prog_id", "fd_index")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    PROG_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROG_ID_FIELD_NUMBER: _ClassVar[int]
    FD_INDEX_FIELD_NUMBER: _ClassVar[int]
    name: str
    section: str
    prog_type: int
    prog_id: int
    fd_index: int
    def __init__(self, name: _Optional[str] = ..., section: _Optional[str] = ..., prog_type: _Optional[int] = ..., prog_id: _Optional[int] = ..., fd_index: _Optional[int] = ...) -> None: ...

class AttachReply(_message.Message):
    __slots__ = ("attachment_id", "program", "sha256", "scope", "shared", "maps", "programs", "btf", "possible_cpus", "lease_expires_unix", "skipped_functions", "since_ns")
    ATTACHMENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    MAPS_FIELD_NUMBER: _ClassVar[int]
    PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    BTF_FIELD_NUMBER: _ClassVar[int]
    POSSIBLE_CPUS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_UNIX_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    SINCE_NS_FIELD_NUMBER: _ClassVar[int]
    attachment_id: int
    program: str
    sha256: str
    scope: Scope
    shared: bool
    maps: _containers.RepeatedCompositeFieldContainer[MapDescription]
    programs: _containers.RepeatedCompositeFieldContainer[ProgramDescription]
    btf: bytes
    possible_cpus: int
    lease_expires_unix: int
    skipped_functions: _containers.RepeatedScalarFieldContainer[str]
    since_ns: int
    def __init__(self, attachment_id: _Optional[int] = ..., program: _Optional[str] = ..., sha256: _Optional[str] = ..., scope: _Optional[_Union[Scope, str]] = ..., shared: _Optional[bool] = ..., maps: _Optional[_Iterable[_Union[MapDescription, _Mapping]]] = ..., programs: _Optional[_Iterable[_Union[ProgramDescription, _Mapping]]] = ..., btf: _Optional[bytes] = ..., possible_cpus: _Optional[int] = ..., lease_expires_unix: _Optional[int] = ..., skipped_functions: _Optional[_Iterable[str]] = ..., since_ns: _Optional[int] = ...) -> None: ...

class DetachRequest(_message.Message):
    __slots__ = ("attachment_id",)
    ATTACHMENT_ID_FIELD_NUMBER: _ClassVar[int]
    attachment_id: int
    def __init__(self, attachment_id: _Optional[int] = ...) -> None: ...

class DetachReply(_message.Message):
    __slots__ = ("unloaded",)
    UNLOADED_FIELD_NUMBER: _ClassVar[int]
    unloaded: bool
    def __init__(self, unloaded: _Optional[bool] = ...) -> None: ...

class ReadMapRequest(_message.Message):
    __slots__ = ("attachment_id", "map", "max_entries", "cursor", "packed")
    ATTACHMENT_ID_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    attachment_id: int
    map: str
    max_entries: int
    cursor: bytes
    packed: bool
    def __init__(self, attachment_id: _Optional[int] = ..., map: _Optional[str] = ..., max_entries: _Optional[int] = ..., cursor: _Optional[bytes] = ..., packed: _Optional[bool] = ...) -> None: ...

class MapEntry(_message.Message):
    __slots__ = ("key", "value", "per_cpu")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    PER_CPU_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    per_cpu: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., per_cpu: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ReadMapReply(_message.Message):
    __slots__ = ("entries", "next_cursor", "keys", "values", "count", "ncpus")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    NCPUS_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[MapEntry]
    next_cursor: bytes
    keys: bytes
    values: bytes
    count: int
    ncpus: int
    def __init__(self, entries: _Optional[_Iterable[_Union[MapEntry, _Mapping]]] = ..., next_cursor: _Optional[bytes] = ..., keys: _Optional[bytes] = ..., values: _Optional[bytes] = ..., count: _Optional[int] = ..., ncpus: _Optional[int] = ...) -> None: ...

class StreamEventsRequest(_message.Message):
    __slots__ = ("attachment_id", "map", "max_events")
    ATTACHMENT_ID_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    MAX_EVENTS_FIELD_NUMBER: _ClassVar[int]
    attachment_id: int
    map: str
    max_events: int
    def __init__(self, attachment_id: _Optional[int] = ..., map: _Optional[str] = ..., max_events: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "data")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    seq: int
    data: bytes
    def __init__(self, seq: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("events", "lost", "end")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    lost: int
    end: bool
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., lost: _Optional[int] = ..., end: _Optional[bool] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("attachment_id",)
    ATTACHMENT_ID_FIELD_NUMBER: _ClassVar[int]
    attachment_id: int
    def __init__(self, attachment_id: _Optional[int] = ...) -> None: ...

class ProgramStats(_message.Message):
    __slots__ = ("attachment_id", "program", "function", "prog_id", "run_cnt", "run_time_ns", "recursion_misses")
    ATTACHMENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    PROG_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_CNT_FIELD_NUMBER: _ClassVar[int]
    RUN_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    RECURSION_MISSES_FIELD_NUMBER: _ClassVar[int]
    attachment_id: int
    program: str
    function: str
    prog_id: int
    run_cnt: int
    run_time_ns: int
    recursion_misses: int
    def __init__(self, attachment_id: _Optional[int] = ..., program: _Optional[str] = ..., function: _Optional[str] = ..., prog_id: _Optional[int] = ..., run_cnt: _Optional[int] = ..., run_time_ns: _Optional[int] = ..., recursion_misses: _Optional[int] = ...) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("programs", "stats_enabled")
    PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    STATS_ENABLED_FIELD_NUMBER: _ClassVar[int]
    programs: _containers.RepeatedCompositeFieldContainer[ProgramStats]
    stats_enabled: bool
    def __init__(self, programs: _Optional[_Iterable[_Union[ProgramStats, _Mapping]]] = ..., stats_enabled: _Optional[bool] = ...) -> None: ...

class IssueTokenRequest(_message.Message):
    __slots__ = ("ttl_seconds",)
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ttl_seconds: int
    def __init__(self, ttl_seconds: _Optional[int] = ...) -> None: ...

class IssueTokenReply(_message.Message):
    __slots__ = ("token", "expires_unix")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_FIELD_NUMBER: _ClassVar[int]
    token: str
    expires_unix: int
    def __init__(self, token: _Optional[str] = ..., expires_unix: _Optional[int] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("id", "hello", "list_programs", "attach", "detach", "read_map", "stream_events", "stats", "issue_token")
    ID_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    LIST_PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    DETACH_FIELD_NUMBER: _ClassVar[int]
    READ_MAP_FIELD_NUMBER: _ClassVar[int]
    STREAM_EVENTS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    ISSUE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    id: int
    hello: HelloRequest
    list_programs: ListProgramsRequest
    attach: AttachRequest
    detach: DetachRequest
    read_map: ReadMapRequest
    stream_events: StreamEventsRequest
    stats: StatsRequest
    issue_token: IssueTokenRequest
    def __init__(self, id: _Optional[int] = ..., hello: _Optional[_Union[HelloRequest, _Mapping]] = ..., list_programs: _Optional[_Union[ListProgramsRequest, _Mapping]] = ..., attach: _Optional[_Union[AttachRequest, _Mapping]] = ..., detach: _Optional[_Union[DetachRequest, _Mapping]] = ..., read_map: _Optional[_Union[ReadMapRequest, _Mapping]] = ..., stream_events: _Optional[_Union[StreamEventsRequest, _Mapping]] = ..., stats: _Optional[_Union[StatsRequest, _Mapping]] = ..., issue_token: _Optional[_Union[IssueTokenRequest, _Mapping]] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("id", "error", "hello", "list_programs", "attach", "detach", "read_map", "events", "stats", "issue_token")
    ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    LIST_PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    DETACH_FIELD_NUMBER: _ClassVar[int]
    READ_MAP_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    ISSUE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    id: int
    error: Error
    hello: HelloReply
    list_programs: ListProgramsReply
    attach: AttachReply
    detach: DetachReply
    read_map: ReadMapReply
    events: EventBatch
    stats: StatsReply
    issue_token: IssueTokenReply
    def __init__(self, id: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., hello: _Optional[_Union[HelloReply, _Mapping]] = ..., list_programs: _Optional[_Union[ListProgramsReply, _Mapping]] = ..., attach: _Optional[_Union[AttachReply, _Mapping]] = ..., detach: _Optional[_Union[DetachReply, _Mapping]] = ..., read_map: _Optional[_Union[ReadMapReply, _Mapping]] = ..., events: _Optional[_Union[EventBatch, _Mapping]] = ..., stats: _Optional[_Union[StatsReply, _Mapping]] = ..., issue_token: _Optional[_Union[IssueTokenReply, _Mapping]] = ...) -> None: ...
