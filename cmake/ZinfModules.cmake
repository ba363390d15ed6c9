# SPDX-License-Identifier: Apache-2.0
# One OBJECT library per module, each compiled and linked with only the dependencies it names:
#
#   zinf_module(zinf_engine SOURCES engine.c comm_mpi.c DEPS MPI::MPI_C)
#
# Targets for DEPS, each only when its ZINF_HAVE_* is 1: Threads::Threads, m, OpenMP::OpenMP_C,
# PkgConfig::HWLOC, PkgConfig::LIBURING, LIBAIO::aio, CUDA::cudart, MPI::MPI_C, NCCL::nccl.
# DEPS are link items (imported targets, library paths, plain names such as m); they are the
# module's PRIVATE usage requirements when it is compiled, and libzinf (shared and static) links
# the union of every module's DEPS. The pkg-config file lists that union too (zinf_pc_private):
# a dependency with no mapping there stops the configure, so a new one cannot be forgotten.
# Every module also gets zinf_base: the include directories and _GNU_SOURCE, nothing to link.
set_property(GLOBAL PROPERTY ZINF_MODULES "")
set_property(GLOBAL PROPERTY ZINF_MODULE_DEPS "")

function(zinf_module name)
	cmake_parse_arguments(M "" "" "SOURCES;DEPS" ${ARGN})
	if(M_UNPARSED_ARGUMENTS)
		message(FATAL_ERROR "zinf_module(${name}): unexpected ${M_UNPARSED_ARGUMENTS} "
			"(write SOURCES ... DEPS ...)")
	endif()
	add_library(${name} OBJECT ${M_SOURCES})
	target_link_libraries(${name} PRIVATE zinf_base ${M_DEPS})
	set_target_properties(${name} PROPERTIES C_VISIBILITY_PRESET hidden
		CUDA_VISIBILITY_PRESET hidden)
	set_property(GLOBAL APPEND PROPERTY ZINF_MODULES ${name})
	set_property(GLOBAL APPEND PROPERTY ZINF_MODULE_DEPS ${M_DEPS})
endfunction()

# A library file path as -L<dir> -l<name> (for the .pc file).
function(_zinf_pc_lib path out)
	get_filename_component(dir "${path}" DIRECTORY)
	get_filename_component(file "${path}" NAME_WE)
	string(REGEX REPLACE "^lib" "" lib "${file}")
	if(dir IN_LIST CMAKE_C_IMPLICIT_LINK_DIRECTORIES)
		set(${out} "-l${lib}" PARENT_SCOPE) # the linker searches there anyway
	else()
		set(${out} "-L${dir} -l${lib}" PARENT_SCOPE)
	endif()
endfunction()

# Requires.private and Libs.private of zinf.pc from the modules' DEPS.
function(zinf_pc_private req_var libs_var)
	get_property(deps GLOBAL PROPERTY ZINF_MODULE_DEPS)
	list(REMOVE_DUPLICATES deps)
	set(req "")
	set(libs "")
	foreach(d IN LISTS deps)
		if(d MATCHES "^PkgConfig::(.*)$")
			# the pkg-config module name that pkg_check_modules(<prefix> ...) was given
			list(APPEND req "${ZINF_PC_NAME_${CMAKE_MATCH_1}}")
		elseif(d STREQUAL "OpenMP::OpenMP_C")
			list(APPEND libs "${OpenMP_C_FLAGS}")
		elseif(d STREQUAL "Threads::Threads")
			list(APPEND libs "-lpthread")
		elseif(d STREQUAL "CUDA::cudart")
			list(APPEND libs "-L${CUDAToolkit_LIBRARY_DIR} -lcudart")
		elseif(d STREQUAL "NCCL::nccl" OR d STREQUAL "LIBAIO::aio")
			get_target_property(loc ${d} IMPORTED_LOCATION)
			_zinf_pc_lib("${loc}" f)
			list(APPEND libs "${f}")
		elseif(d STREQUAL "MPI::MPI_C")
			foreach(l IN LISTS MPI_C_LIBRARIES)
				_zinf_pc_lib("${l}" f)
				list(APPEND libs "${f}")
			endforeach()
		elseif(IS_ABSOLUTE "${d}")
			_zinf_pc_lib("${d}" f)
			list(APPEND libs "${f}")
		elseif(d MATCHES "^[A-Za-z0-9_]+$")
			list(APPEND libs "-l${d}")
		else()
			message(FATAL_ERROR "zinf_pc_private: no pkg-config mapping for ${d} "
				"(add one in cmake/ZinfModules.cmake)")
		endif()
	endforeach()
	list(REMOVE_DUPLICATES libs)
	string(JOIN " " req ${req})
	string(JOIN " " libs ${libs})
	set(${req_var} "${req}" PARENT_SCOPE)
	set(${libs_var} "${libs}" PARENT_SCOPE)
endfunction()
